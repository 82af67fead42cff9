"""Distillation losses against direct float64 references (and a known zero)."""

import math

import pytest
import torch

from lit_dof.attention import CausalLinearAttention, LearnedPRF, SlidingWindow
from lit_dof.students.losses import attention_distillation_loss, log_kernel_scores


def _setup(seed=0, shares=True):
    torch.manual_seed(seed)
    fm = LearnedPRF(8, 2 if shares else 4, 16, seed=seed)
    twin = CausalLinearAttention(fm, num_heads=4, num_kv_heads=2)
    q, k = 1.5 * torch.randn(2, 4, 10, 8), 1.5 * torch.randn(2, 2, 10, 8)
    return twin, q, k


def _reference(twin, q, k, valid, kind):
    """Direct float64 computation with the feature map's exact kernel and explicit loops."""
    fm, G = twin.feature_map, 2
    B, Hq, T, d = q.shape
    total, count = 0.0, 0
    for b in range(B):
        for h in range(Hq):
            hk = h // G
            fmh = hk if twin.shares_kv_maps else h
            lq = fm.log_features(q[b : b + 1, h : h + 1].expand(1, fm.num_heads, T, d))[0, fmh].double()
            lk = fm.log_features(k[b : b + 1, hk : hk + 1].expand(1, fm.num_heads, T, d))[0, fmh].double()
            khat = torch.logsumexp(lq[:, None, :] + lk[None, :, :], -1).exp()  # (T, T)
            kern = (q[b, h].double() @ k[b, hk].double().T / math.sqrt(d)).exp()
            for i in range(T):
                if not valid[b, i]:
                    continue
                if kind == "softmax":
                    cols = [j for j in range(i + 1) if valid[b, j]]
                    p = kern[i, cols] / kern[i, cols].sum()
                    ph = khat[i, cols] / khat[i, cols].sum()
                    total += float((p * (p.log() - ph.log())).sum().detach())
                    count += 1
                else:
                    cols = [j for j in range(T) if valid[b, j]]
                    total += float(((kern[i, cols] - khat[i, cols]) ** 2).sum().detach())
                    count += len(cols)
    return total / count


@pytest.mark.parametrize("kind", ["softmax", "l2"])
@pytest.mark.parametrize("shares", [True, False])
def test_losses_match_direct_reference(kind, shares):
    twin, q, k = _setup(shares=shares)
    valid = torch.ones(2, 10, dtype=torch.bool)
    valid[1, :3] = False
    loss = attention_distillation_loss(twin, q, k, valid, kind=kind)
    assert loss.item() == pytest.approx(_reference(twin, q, k, valid, kind), rel=1e-4)


def test_softmax_loss_gradients_reach_only_the_feature_map():
    twin, q, k = _setup()
    q.requires_grad_(True)
    loss = attention_distillation_loss(twin, q, k)
    loss.backward()
    assert q.grad is None
    assert twin.feature_map.z.grad is not None and twin.feature_map.z.grad.abs().sum() > 0


def test_row_subset_is_unbiased():
    twin, q, k = _setup(seed=3)
    full = attention_distillation_loss(twin, q, k).item()
    g = torch.Generator().manual_seed(0)
    sub = torch.stack([attention_distillation_loss(twin, q, k, query_rows=3, generator=g) for _ in range(3000)])
    assert sub.mean().item() == pytest.approx(full, rel=0.05)


def test_log_kernel_scores_survive_huge_features():
    lq, lk = torch.randn(1, 1, 5, 7) * 40 + 300, torch.randn(1, 1, 6, 7) * 40 - 500
    ref = torch.logsumexp(lq.double()[..., :, None, :] + lk.double()[..., None, :, :], -1)
    got = log_kernel_scores(lq, lk)
    close = ref > ref.amax(-1, keepdim=True) - 60  # entries that matter after normalisation
    torch.testing.assert_close(got.double()[close], ref[close], rtol=1e-6, atol=1e-3)
    assert torch.isfinite(got).all()


def test_bad_kind():
    twin, q, k = _setup()
    with pytest.raises(ValueError, match="softmax' or 'l2"):
        attention_distillation_loss(twin, q, k, kind="kl")


def test_logit_distillation_matches_categorical_kl():
    """Per-token KL(teacher ‖ student) against torch.distributions, with padding excluded and T² scaling."""
    from lit_dof.students.losses import logit_distillation_loss

    torch.manual_seed(0)
    student, teacher = torch.randn(2, 5, 11), 2 * torch.randn(2, 5, 11)
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    for t in (1.0, 2.0):
        kl = torch.distributions.kl_divergence(
            torch.distributions.Categorical(logits=teacher.double() / t),
            torch.distributions.Categorical(logits=student.double() / t),
        )  # (B, T)
        expected = kl[mask.bool()].mean() * t * t
        got = logit_distillation_loss(student, teacher, mask, temperature=t)
        torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-7)
    changed = student.clone()
    changed[1, :2] = 50 * torch.randn(2, 11)  # padding positions do not count
    torch.testing.assert_close(
        logit_distillation_loss(changed, teacher, mask), logit_distillation_loss(student, teacher, mask)
    )
    assert logit_distillation_loss(teacher, teacher).abs() < 1e-6
    with pytest.raises(ValueError, match="temperature"):
        logit_distillation_loss(student, teacher, temperature=0.0)
    with pytest.raises(ValueError, match="differ in shape"):
        logit_distillation_loss(student[:, :4], teacher)


def test_output_loss_matches_explicit_reference():
    """Relative squared error of the twin's output against a given target, with the twin's output computed
    here by explicit float64 loops over K̂ (causal, padding excluded)."""
    from lit_dof.students.losses import attention_output_loss

    twin, q, k = _setup(seed=3)
    torch.manual_seed(4)
    v = torch.randn(2, 2, 10, 8)
    out = torch.randn(2, 10, 4, 8)  # an arbitrary "teacher output" (B, T, Hq, D)
    valid = torch.ones(2, 10, dtype=torch.bool)
    valid[1, :3] = False
    fm, G = twin.feature_map, 2
    err = norm = 0.0
    for b in range(2):
        for h in range(4):
            hk = h // G
            lq = fm.log_features(q[b : b + 1, h : h + 1].expand(1, fm.num_heads, 10, 8))[0, hk].double()
            lk = fm.log_features(k[b : b + 1, hk : hk + 1].expand(1, fm.num_heads, 10, 8))[0, hk].double()
            khat = torch.logsumexp(lq[:, None, :] + lk[None, :, :], -1).exp().detach()
            for i in range(10):
                if not valid[b, i]:
                    continue
                cols = [j for j in range(i + 1) if valid[b, j]]
                y = (khat[i, cols, None] * v[b, hk, cols].double()).sum(0) / khat[i, cols].sum()
                err += float(((y - out[b, i, h].double()) ** 2).sum())
                norm += float((out[b, i, h].double() ** 2).sum())
    loss = attention_output_loss(twin, q, k, v, out, valid)
    assert float(loss) == pytest.approx(err / norm, rel=1e-4)
    loss.backward()
    assert twin.feature_map.z.grad is not None and twin.feature_map.z.grad.abs().sum() > 0


@pytest.mark.parametrize("sinks", [0, 2], ids=["w3", "w3-s2"])
def test_windowed_softmax_loss_is_kl_to_the_twins_whole_rows(sinks):
    """KL(teacher row ‖ the sliding-window twin's row), the twin's row read off the float64 reference with
    one-hot values (its output is then the attention matrix); padding excluded."""
    from lit_dof.attention import SlidingWindowLinearAttention
    from lit_dof.attention.ops.sliding_window.naive import naive_sliding_window_attention

    torch.manual_seed(4)
    fm = LearnedPRF(8, 2, 16, seed=4)
    twin = SlidingWindowLinearAttention(fm, 4, 2, sliding_window=SlidingWindow(window=3, sink_tokens=sinks))
    with torch.no_grad():
        twin.log_mix.normal_()
    B, T = 2, 10
    q, k = 1.5 * torch.randn(B, 4, T, 8), 1.5 * torch.randn(B, 2, T, 8)
    valid = torch.ones(B, T, dtype=torch.bool)
    valid[1, :2] = False
    loss = attention_distillation_loss(twin, q, k, valid, kind="softmax")
    onehot = torch.eye(T, dtype=torch.float64).expand(B, 2, T, T)
    lq, lk = fm.log_features(q.reshape(B, 2, 2 * T, 8)).view(B, 4, T, -1), fm.log_features(k)
    mix = twin.log_mix.detach()
    p_hat = naive_sliding_window_attention(
        q.double(), k.double(), onehot, lq, lk, window=3, sink_tokens=sinks, log_mix=mix, key_padding_mask=valid
    )
    logits = q.double() @ k.double().repeat_interleave(2, 1).transpose(-1, -2) / math.sqrt(8)
    allowed = torch.ones(T, T).tril().bool()[None, None] & valid[:, None, None, :]
    p = logits.masked_fill(~allowed, -torch.inf).softmax(-1)
    kl = torch.where(allowed, p * (p.clamp_min(1e-300).log() - p_hat.clamp_min(1e-300).log()), 0).sum(-1)
    rows = valid[:, None, :].expand_as(kl)
    torch.testing.assert_close(loss.double(), kl[rows].mean(), rtol=1e-4, atol=1e-6)
    loss.backward()
    assert fm.z.grad.abs().sum() > 0 and twin.log_mix.grad.abs().sum() > 0


def test_windowed_twin_refuses_what_is_undefined():
    from lit_dof.attention import SlidingWindowLinearAttention

    q, k = torch.randn(1, 4, 5, 8), torch.randn(1, 2, 5, 8)
    twin = SlidingWindowLinearAttention(LearnedPRF(8, 2, 4), 4, 2, sliding_window=SlidingWindow(window=3))
    with pytest.raises(ValueError, match="not defined for sliding-window"):
        attention_distillation_loss(twin, q, k, kind="l2")
    alone = SlidingWindowLinearAttention(
        LearnedPRF(8, 2, 4), 4, 2, sliding_window=SlidingWindow(window=3, far_term=False)
    )
    with pytest.raises(ValueError, match="nothing to distil"):
        attention_distillation_loss(alone, q, k)


def _every_loss(twin, q, k, v, out, valid, student, teacher, autocast=False):
    """Each loss of this module on the same inputs, with the feature map's gradient of each; the forward
    under CPU bf16 autocast if ``autocast``, the backward outside it (as Lightning does)."""
    from lit_dof.students.losses import attention_output_loss, logit_distillation_loss

    losses = {
        "softmax": lambda: attention_distillation_loss(twin, q, k, valid, kind="softmax"),
        "l2": lambda: attention_distillation_loss(twin, q, k, valid, kind="l2"),
        "output": lambda: attention_output_loss(twin, q, k, v, out, valid),
        "logit_kd": lambda: logit_distillation_loss(student, teacher, valid.long(), temperature=2.0),
    }
    results = {}
    for name, fn in losses.items():
        twin.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = fn()
        if loss.requires_grad:
            loss.backward()
        grad = twin.feature_map.z.grad
        results[name] = (loss.detach(), None if grad is None else grad.clone())
    return results


def _loss_inputs():
    twin, q, k = _setup(seed=5)
    g = torch.Generator().manual_seed(6)
    v, out = torch.randn(2, 2, 10, 8, generator=g), torch.randn(2, 10, 4, 8, generator=g)
    student, teacher = torch.randn(2, 10, 11, generator=g), 2 * torch.randn(2, 10, 11, generator=g)
    valid = torch.ones(2, 10, dtype=torch.bool)
    valid[1, :3] = False
    return twin, q, k, v, out, valid, student, teacher


def test_losses_under_bf16_autocast_equal_float32():
    """Under CPU bf16 autocast (``bf16-mixed``) every loss and its feature-map gradient equal the float32
    ones to float32 rounding (the matmuls that autocast would lower to bf16 stay float32 inside)."""
    inputs = _loss_inputs()
    want = _every_loss(*inputs)
    got = _every_loss(*inputs, autocast=True)
    for name, (loss, grad) in got.items():
        assert loss.dtype == torch.float32, name
        torch.testing.assert_close(loss, want[name][0], rtol=1e-6, atol=1e-7, msg=name)
        if grad is not None:
            torch.testing.assert_close(grad, want[name][1], rtol=1e-5, atol=1e-6, msg=name)
    assert sum(grad is not None for _, grad in got.values()) == 3  # the three layer losses reach the map


def test_losses_of_bf16_inputs_equal_their_float32_upcast():
    """bf16 teacher activations (``bf16-true``) give the loss of the same values upcast to float32: nothing
    of the computation (the twin's output in the output loss included) is rounded back to bf16."""
    twin, q, k, v, out, valid, student, teacher = _loss_inputs()
    halves = [x.bfloat16() for x in (q, k, v, out, student, teacher)]
    upcast = [x.float() for x in halves]
    got, want = _every_loss(twin, *halves[:4], valid, *halves[4:]), _every_loss(twin, *upcast[:4], valid, *upcast[4:])
    for name in want:
        assert got[name][0].dtype == torch.float32
        torch.testing.assert_close(got[name][0], want[name][0], rtol=1e-6, atol=1e-7, msg=name)
