"""Training strategies: Lightning's ModelParallelStrategy set up for sharded data parallelism (FSDP2 only)."""

from __future__ import annotations

from typing import Literal

from lightning.pytorch.strategies import ModelParallelStrategy


class ShardedDataParallelStrategy(ModelParallelStrategy):
    """Lightning's ModelParallelStrategy for FSDP2 without tensor parallelism.

    Lightning's ``data_parallel_size="auto"`` is the number of nodes and its ``tensor_parallel_size="auto"``
    the devices per node, so a config that shards over every device cannot be written without knowing the
    world size. Here ``tensor_parallel_size`` defaults to 1 and ``data_parallel_size="auto"`` is the world
    size divided by it: ``--trainer.devices`` and ``--trainer.num_nodes`` alone choose the data-parallel
    group. Other arguments are the parent's.

    Args:
        data_parallel_size: devices in a data-parallel (sharding) group, or ``"auto"`` (see above).
        tensor_parallel_size: devices in a tensor-parallel group; ``"auto"`` keeps Lightning's meaning for
            both sizes.
        **kwargs: passed to :class:`~lightning.pytorch.strategies.ModelParallelStrategy`.
    """

    def __init__(
        self,
        data_parallel_size: Literal["auto"] | int = "auto",
        tensor_parallel_size: Literal["auto"] | int = 1,
        **kwargs,
    ) -> None:
        super().__init__(data_parallel_size=data_parallel_size, tensor_parallel_size=tensor_parallel_size, **kwargs)

    def setup_environment(self) -> None:
        """Resolve ``data_parallel_size="auto"`` to the world size over ``tensor_parallel_size``, then set up as
        the parent does."""
        if self._data_parallel_size == "auto" and self._tensor_parallel_size != "auto":
            self._data_parallel_size = max(1, self.num_nodes * self.num_processes // self._tensor_parallel_size)
        super().setup_environment()
