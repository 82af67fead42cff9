"""The gated delta rule (``lit_dof.attention.ops.delta_rule``): the chunked form against the sequential float64
recurrence (forward and gradients of every input, GQA, any chunk size, a carried state), continuation equal to one
pass, flash-linear-attention's own reference, and the closed forms that make it a memory: an orthonormal key reads
back exactly its last value (a second write replaces the first), β = 0 writes nothing, the gate forgets."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lit_dof.attention.ops.delta_rule.chunked import chunked_delta_rule
from lit_dof.attention.ops.delta_rule.naive import naive_delta_rule

TOL = {"rtol": 1e-5, "atol": 1e-5}


def _inputs(B=2, Hq=4, Hk=2, N=37, M=6, D=5, seed=0, rate=0.3):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, N, M, generator=g, dtype=torch.float64)
    k = F.normalize(torch.randn(B, Hk, N, M, generator=g, dtype=torch.float64), dim=-1)
    v = torch.randn(B, Hk, N, D, generator=g, dtype=torch.float64)
    beta = torch.rand(B, Hk, N, generator=g, dtype=torch.float64)
    gates = -rate * torch.rand(B, Hk, N, generator=g, dtype=torch.float64)
    state = torch.randn(B, Hk, M, D, generator=g, dtype=torch.float64)
    return q, k, v, beta, gates, state


@pytest.mark.parametrize("chunk", [1, 5, 16, 64])
@pytest.mark.parametrize("gated", [False, True], ids=["deltanet", "gated"])
@pytest.mark.parametrize("layout", [(2, 2), (4, 2)], ids=["mha", "gqa"])
def test_chunked_matches_the_float64_recurrence_forward_and_gradients(chunk, gated, layout):
    Hq, Hk = layout
    inputs = list(_inputs(Hq=Hq, Hk=Hk, seed=chunk))
    if not gated:
        inputs[4] = None
    leaves = [x.clone().requires_grad_() if x is not None else None for x in inputs]
    ref_leaves = [x.clone().requires_grad_() if x is not None else None for x in inputs]
    q, k, v, beta, gates, state = leaves
    out, final = chunked_delta_rule(q, k, v, beta, gates, chunk_size=chunk, initial_state=state)
    ref, ref_final = naive_delta_rule(*ref_leaves)
    torch.testing.assert_close(out, ref, **TOL)
    torch.testing.assert_close(final.double(), ref_final, **TOL)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    w_state = torch.randn(final.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    ((out * w).sum() + (final * w_state).sum()).backward()
    ((ref * w).sum() + (ref_final * w_state).sum()).backward()
    for name, a, b in zip(["q", "k", "v", "beta", "gates", "state"], leaves, ref_leaves):
        if a is not None:
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-4, msg=lambda m, n=name: f"grad {n}: {m}")


@pytest.mark.parametrize("splits", [[1] * 20, [7, 1, 12], [13, 7]], ids=["token-by-token", "mixed", "13+7"])
def test_continuing_from_the_state_equals_one_pass(splits):
    q, k, v, beta, gates, _ = _inputs(N=20, seed=3)
    full, final = chunked_delta_rule(q, k, v, beta, gates, chunk_size=8)
    state, outs, start = None, [], 0
    for n in splits:
        part = slice(start, start + n)
        y, state = chunked_delta_rule(
            *(x[:, :, part] for x in (q, k, v, beta, gates)), chunk_size=8, initial_state=state
        )
        outs.append(y)
        start += n
    torch.testing.assert_close(torch.cat(outs, 2), full, **TOL)
    torch.testing.assert_close(state, final, **TOL)


def test_an_orthonormal_key_reads_back_its_last_value_and_beta_zero_writes_nothing():
    M, D = 4, 3
    keys = torch.eye(M, dtype=torch.float64)[[0, 1, 0, 2, 3]][None, None]  # key e_0 written twice
    values = torch.randn(1, 1, 5, D, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    beta = torch.tensor([[[1.0, 1.0, 1.0, 0.0, 1.0]]], dtype=torch.float64)  # the write under e_2 is switched off
    queries = torch.eye(M, dtype=torch.float64)[[0, 1, 0, 2, 3]][None, None]
    out, state = chunked_delta_rule(queries, keys, values, beta, chunk_size=2)
    torch.testing.assert_close(state[0, 0, 0], values[0, 0, 2].float())  # the second write replaced the first
    torch.testing.assert_close(state[0, 0, 1], values[0, 0, 1].float())
    assert state[0, 0, 2].abs().max() == 0  # β = 0: nothing written under e_2
    torch.testing.assert_close(out[0, 0, 4], values[0, 0, 4])  # read right after the write
    additive = torch.einsum("tm,td->md", keys[0, 0], values[0, 0] * beta[0, 0, :, None])  # linear attention sums
    assert (additive[0] - state[0, 0, 0].double()).abs().max() > 1e-3


def test_the_gate_forgets_the_state_geometrically():
    q, k, v, _, _, state = _inputs(N=6, seed=4)
    beta = torch.zeros(2, 2, 6, dtype=torch.float64)  # no writes: only the gate acts
    gates = torch.full((2, 2, 6), -0.5, dtype=torch.float64)
    _, final = chunked_delta_rule(q, k, v, beta, gates, chunk_size=4, initial_state=state)
    torch.testing.assert_close(final.double(), state * torch.exp(torch.tensor(-3.0, dtype=torch.float64)), **TOL)


def test_matches_flash_linear_attentions_reference():
    naive = pytest.importorskip("fla.ops.gated_delta_rule.naive", reason="flash-linear-attention (lit-dof[gpu])")
    q, k, v, beta, gates, state = _inputs(Hq=2, Hk=2, N=30, seed=5)
    out, final = chunked_delta_rule(q, k, v, beta, gates, chunk_size=8, initial_state=state)
    layout = [x.transpose(1, 2) for x in (q, k, v, beta, gates)]  # fla's (B, N, H, ·)
    ref, ref_final = naive.naive_recurrent_gated_delta_rule(
        *layout, scale=1.0, initial_state=state, output_final_state=True
    )
    torch.testing.assert_close(out, ref.transpose(1, 2).to(out.dtype), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(final, ref_final.float(), rtol=1e-4, atol=1e-5)


def test_bad_shapes_are_named():
    q, k, v, beta, gates, _ = _inputs(N=5)
    with pytest.raises(ValueError, match=r"beta must have shape \(B, Hk, N\)"):
        chunked_delta_rule(q, k, v, beta[:, :1], gates)
    with pytest.raises(ValueError, match="Hq % Hk == 0"):
        chunked_delta_rule(q[:, :3], k, v, beta, gates)
    with pytest.raises(ValueError, match="chunk_size must be a positive integer"):
        chunked_delta_rule(q, k, v, beta, gates, chunk_size=0)
