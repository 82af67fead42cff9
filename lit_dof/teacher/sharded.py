"""A teacher sharded with FSDP2 that never exists whole on more than one rank: rank 0 loads, the others build it
on the meta device, every rank shards it, and rank 0 broadcasts the weights one tensor at a time.

Why rank 0 loads and broadcasts (and not every rank reading its own slices from safetensors): the loading path of
:func:`~lit_dof.teacher.loading.load_teacher` stays the one place that knows every source (embedded GGUF alias,
``.gguf`` file, local directory, hub id), transformers' key renaming and weight tying, and the dtype conversion;
a per-rank lazy reader would have to repeat all of it for each checkpoint layout. The weights then reach the
other ranks through the library: :func:`torch.distributed.checkpoint.state_dict.set_model_state_dict` with
``StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)`` broadcasts one tensor at a time and keeps
each rank's shard of it (``torch.distributed._state_dict_utils._broadcast_state_dict``). Host RAM:

* rank 0: the whole teacher in the target dtype (``bf16-true``: bfloat16, never float32 unless asked), its own
  shards, and one tensor in flight; the whole copy is freed before this function returns;
* every other rank: its shards (1 / W of the parameters), the buffers, and the one full tensor in flight (the
  largest is the embedding, V × h).

Sources: PyTorch's FSDP2 meta-device initialisation (``fully_shard`` on meta parameters, ``to_empty``, then a
load; the torchtitan recipe, https://github.com/pytorch/torchtitan/blob/main/docs/fsdp.md) and
``set_model_state_dict``'s ``broadcast_from_rank0`` option (PyTorch ``torch.distributed.checkpoint.state_dict``).
"""

from __future__ import annotations

import os

import torch
from torch import nn
from transformers import AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

from lit_dof.teacher.families import check_supported


def empty_causal_lm(
    config: PretrainedConfig, *, dtype: torch.dtype | None = None, attn_implementation: str | None = None
) -> PreTrainedModel:
    """The causal LM of ``config`` on the meta device: shapes, dtypes and module tree, no storage, no weights.

    Args:
        config: the architecture (e.g. ``AutoConfig.from_pretrained(DIR)``, or a loaded model's ``config``).
        dtype: parameter dtype (``None``: the config's / torch's default).
        attn_implementation: passed to ``from_config`` (``None``: transformers' default).

    Returns:
        the model, every parameter and buffer on ``meta`` (buffers too: rotary tables are meta and must be
        filled, e.g. by :func:`load_sharded_teacher`'s broadcast).
    """
    kwargs = {"dtype": dtype} if dtype is not None else {}
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, **kwargs)


def shard_teacher(model: nn.Module, mesh) -> None:
    """``fully_shard`` every decoder layer (the classes in ``model._no_split_modules``), then the root (embeddings,
    final norm, LM head) over ``mesh``, in place. Parameters attached later (the linear twins) are not managed by
    FSDP: they stay plain tensors, replicated by the caller.

    Args:
        model: a transformers causal LM, on a device or on ``meta``.
        mesh: a 1-D device mesh (the data-parallel group).
    """
    from torch.distributed.fsdp import fully_shard

    layer_classes = set(getattr(model, "_no_split_modules", None) or [])
    for module in model.modules():
        if type(module).__name__ in layer_classes:
            fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)


def reshard(model: nn.Module) -> None:
    """Free the gathered parameters of every FSDP2 module of ``model`` (the root keeps its own gathered after a
    forward): back to one shard per rank, e.g. after the DoF estimate's forwards."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def load_sharded_teacher(
    name_or_path: str,
    mesh,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    attn_implementation: str = "sdpa",
    cache_dir: str | os.PathLike | None = None,
) -> tuple[PreTrainedModel, object]:
    """Load a frozen teacher sharded over ``mesh`` (FSDP2), the whole model on rank 0 only and only while loading.

    Every rank of the default process group must call this. Rank 0 loads the teacher with
    :func:`~lit_dof.teacher.loading.load_teacher` in ``dtype`` (on the CPU) and broadcasts its config; the other
    ranks build the same architecture on the meta device (:func:`empty_causal_lm`) and load only the tokenizer
    (after rank 0, so an embedded GGUF teacher is converted once, by rank 0). Every rank shards
    (:func:`shard_teacher`); the others allocate their shards on ``device``; rank 0 broadcasts the weights tensor
    by tensor (``set_model_state_dict`` with ``full_state_dict`` and ``broadcast_from_rank0``), then every buffer
    (rotary tables are not in the state dict). Every module is then marked initialised (``_is_hf_initialized``, as
    ``from_pretrained`` marks what it loaded): without it, the ``post_init`` of a model that wraps this one (the
    student, :func:`lit_dof.linearize`) re-initialises the meta-built ranks' weights at random. See the module
    docstring for the host RAM this takes.

    Args:
        name_or_path: as :func:`~lit_dof.teacher.loading.load_teacher` takes it.
        mesh: the 1-D device mesh to shard over (the data-parallel group); the broadcast uses the default group.
        dtype: parameter dtype, on every rank (the precision's, e.g. bfloat16 under ``bf16-true``).
        device: where the shards live (the rank's accelerator, or ``cpu`` under gloo).
        attn_implementation: the teacher's softmax attention.
        cache_dir: where GGUF conversions are kept.

    Returns:
        ``(model, tokenizer)`` as :func:`~lit_dof.teacher.loading.load_teacher` returns them, the model's parameters
        sharded ``DTensor``s (eval mode, ``requires_grad=False``).

    Raises:
        RuntimeError: no initialised process group, or the ranks built buffers of different names, shapes or
            dtypes (different transformers versions on the nodes).
        TeacherNotFoundError, ImportError, UnsupportedModelError: from
            :func:`~lit_dof.teacher.loading.load_teacher`, raised on rank 0 (the other ranks then fail in the
            broadcast that follows).
    """
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    from lit_dof.teacher.loading import load_teacher, load_tokenizer

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("load_sharded_teacher needs an initialised process group (torch.distributed)")
    rank = dist.get_rank()
    model = tokenizer = None
    if rank == 0:
        model, tokenizer = load_teacher(
            name_or_path, dtype=dtype, attn_implementation=attn_implementation, cache_dir=cache_dir
        )
    box = [model.config if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    if rank != 0:
        model = empty_causal_lm(box[0], dtype=dtype, attn_implementation=attn_implementation)
        check_supported(model)
        model.config.name_or_path = model.name_or_path = str(name_or_path)
        model.eval().requires_grad_(False)
        tokenizer = load_tokenizer(name_or_path, cache_dir=cache_dir)
    full = model.state_dict() if rank == 0 else {}  # holds rank 0's whole copy until the broadcast is done
    shard_teacher(model, mesh)
    if rank != 0:
        model.to_empty(device=device)
    set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    del full
    _broadcast_buffers(model)
    for module in model.modules():  # loaded: transformers' post_init of a wrapper (the student) must not re-init
        module._is_hf_initialized = True
    return model, tokenizer


def _broadcast_buffers(model: nn.Module) -> None:
    """Give every rank rank 0's buffers (persistent or not), after checking that all ranks have the same ones.

    Raises:
        RuntimeError: the ranks' buffers differ in name, shape or dtype.
    """
    import torch.distributed as dist

    buffers = sorted(model.named_buffers(), key=lambda item: item[0])
    layout = [(name, tuple(b.shape), str(b.dtype)) for name, b in buffers]
    layouts = [None] * dist.get_world_size()
    dist.all_gather_object(layouts, layout)
    if any(other != layouts[0] for other in layouts):
        different = next(r for r, other in enumerate(layouts) if other != layouts[0])
        mismatch = sorted(set(layouts[0]) ^ set(layouts[different]))[:4]
        raise RuntimeError(
            f"rank {different} built the teacher with other buffers than rank 0 (name, shape, dtype): {mismatch}; "
            "are the ranks running the same transformers version?"
        )
    for _, buffer in buffers:
        dist.broadcast(buffer, src=0)


def pad_sharded_forwards(teacher: nn.Module, count: int, device: torch.device) -> None:
    """Run ``count`` unrecorded one-token forwards of a teacher sharded with FSDP2 (its all-gathers are collectives
    every rank must join; the input's shape does not matter to them); nothing for an unsharded teacher."""
    from torch.distributed.fsdp import FSDPModule

    if count <= 0 or not isinstance(teacher, FSDPModule):
        return
    with torch.no_grad():
        for _ in range(count):
            teacher(input_ids=torch.zeros((1, 1), dtype=torch.long, device=device), use_cache=False)
