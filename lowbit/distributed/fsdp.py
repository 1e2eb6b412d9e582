"""FP8 all-gather of Linear weights under FSDP2 (``torch.distributed.fsdp.fully_shard``).

``FP8GatherWeight`` wraps a lowbit ``Linear``'s high-precision weight (it behaves as that tensor
for every op: optimizer, init, state_dict) and implements FSDP2's all-gather extension: each rank
casts its own shard to FP8 before the all-gather (``fsdp_pre_all_gather``), FSDP2 gathers FP8
bytes (half of bf16), and the unsharded parameter is an ``FP8Tensor`` (``fsdp_post_all_gather``)
that the Linear uses as its cast weight (``lowbit.nn.ops``: forward as it is, dgrad its transpose).
The codes are exactly those the layer would have cast from the gathered high-precision weight
(tests: bit-identical forward and backward), because the scale is the same on every shard:

* ``Delayed``: the scale of the layer's weight state (the same on every rank: ``StepSync``); the
  cast records the shard's amax, whose MAX across ranks (the step's history all-reduce) is the
  whole weight's. The cold start primes from the all-reduced amax of the shards.
* ``Current`` (tensorwise): the amaxes of every such shard of the model, all-reduced (MAX) in ONE
  collective at the step's first all-gather (torchao's ``precompute_float8_dynamic_scale_for_fsdp``,
  with no call to remember): ``scale = amax(W) / fmax``.
* ``Blockwise`` (square weight blocks, 128x128): each shard is cast on its own, no collective.
  Blocks stay whole only when every shard has a multiple of 128 rows, i.e. ``out_features`` is a
  multiple of ``128 * world`` (or one rank); otherwise (uneven or misaligned shards) the weight is
  gathered in high precision and cast after the gather, as without FSDP (FSDP2 also requires
  every all-gather input of an unevenly sharded parameter to have the padded shard's shape,
  which the block scales do not). Llama shapes (4096, 14336, 1024 rows) qualify up to 8 ranks.

Rowwise, MX and NV weights (their transposed dgrad operand is quantized along the other dim,
from the high-precision weight), ``TransposedLinear`` layers and weights sharded on dim 1
(``shard_placement_fn``) are gathered in high precision.

Each step casts a weight once: the backward's re-gather (``reshard_after_forward=True``) reuses
the forward's scale and records no second amax, so forward and dgrad see the same codes, as
without FSDP. The step boundary is ``StepSync``'s. Under ``MixedPrecisionPolicy(param_dtype=...)``
the shard is rounded to ``param_dtype`` before the cast, as the plain path casts the gathered
``param_dtype`` weight. Uneven shards are zero-padded to FSDP2's padded shard (zero changes no amax).
"""
from __future__ import annotations

import weakref
from typing import Optional

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor
from torch.utils import _pytree as pytree

from ..dtypes.fp8_tensor import FP8_OPS, FP8Tensor
from ..kernels import quantize_fp8
from ..nn.linear import Linear
from ..nn.spec import effective_backend
from ..scaling.blocks import TENSOR, block_amax
from ..scaling.delayed import DelayedScalingState
from ..scaling.recipes import Blockwise, Current, Delayed
from .group import all_reduce_max

__all__ = ["FP8GatherWeight", "WeightGather", "gathers_fp8", "fp8_gathered"]

aten = torch.ops.aten

# ops whose results stay wrapped: what FSDP2 does to a parameter while sharding it, and what
# module utilities (to(), to_empty(), nn.Parameter, clone) do; everything else returns plain tensors
_KEEP = {aten.detach.default, aten.alias.default, aten.clone.default, aten.empty_like.default,
         aten.new_zeros.default, aten.new_empty.default, aten.slice.Tensor, aten.copy_.default,
         aten.view.default, aten.as_strided.default, aten._to_copy.default, aten._pin_memory.default,
         aten.split.Tensor, aten.split_with_sizes.default}


def gathers_fp8(module) -> bool:
    """Whether ``module``'s weight can be all-gathered in FP8 (module docstring; Blockwise also
    needs aligned shards, decided at the all-gather)."""
    if type(module) is not Linear:
        return False
    r = module.recipe
    return isinstance(r, (Delayed, Current)) or (
        isinstance(r, Blockwise) and r.weight[0] == r.weight[1] and r.weight[0] > 0)


def fp8_gathered(recipe, rows: int, world: int) -> bool:
    """Whether a ``gathers_fp8`` weight of ``rows`` rows, sharded on dim 0, travels in FP8 over
    ``world`` shards: tensorwise always, square blocks when every shard holds whole blocks."""
    block = recipe.granularity("weight")
    return block.is_tensorwise or world == 1 or rows % (world * block.rows) == 0


class FP8GatherWeight(torch.Tensor):
    """A high-precision weight that FSDP2 all-gathers in FP8 (module docstring)."""

    @staticmethod
    def __new__(cls, tensor: torch.Tensor, gather: "WeightGather"):
        return torch.Tensor._make_wrapper_subclass(
            cls, tensor.size(), strides=tensor.stride(), storage_offset=tensor.storage_offset(),
            dtype=tensor.dtype, layout=tensor.layout, device=tensor.device, requires_grad=tensor.requires_grad)

    def __init__(self, tensor: torch.Tensor, gather: "WeightGather"):
        self._tensor = tensor
        self._gather = gather

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        gather = next(t._gather for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, cls))
        args, kwargs = pytree.tree_map_only(cls, lambda t: t._tensor, (args, kwargs or {}))
        out = func(*args, **kwargs)
        if func in _KEEP:
            return pytree.tree_map_only(torch.Tensor, lambda t: cls(t, gather), out)
        return out

    def __tensor_flatten__(self):
        return ["_tensor"], self._gather

    @staticmethod
    def __tensor_unflatten__(inner, gather, outer_size, outer_stride):
        return FP8GatherWeight(inner["_tensor"], gather)

    def __reduce_ex__(self, protocol):  # pickles (torch.save) as the plain high-precision tensor
        return self._tensor.__reduce_ex__(protocol)

    def __repr__(self) -> str:
        return f"FP8GatherWeight({self._tensor!r})"

    def fsdp_pre_all_gather(self, mesh, outer_size, outer_stride, module, mp_policy):
        return self._gather.pre_all_gather(self._tensor, mesh, outer_size, module, mp_policy)

    def fsdp_post_all_gather(self, outputs, metadata, param_dtype, *, out: Optional[torch.Tensor] = None):
        return WeightGather.post_all_gather(outputs, metadata, param_dtype, out)


def _twin(recipe):
    """A Delayed recipe casting the weight like ``recipe`` (a fixed-scale cast is a delayed cast)."""
    return recipe if isinstance(recipe, Delayed) else Delayed(
        input_format=recipe.input_format, weight_format=recipe.weight_format, grad_format=recipe.grad_format,
        history_len=1)


def _cast_with(x: torch.Tensor, recipe, scale: torch.Tensor, backend: str) -> FP8Tensor:
    """``x`` cast with the tensorwise ``scale`` (the fused kernel, on throwaway state buffers)."""
    twin = _twin(recipe)
    scratch = DelayedScalingState.over(twin, twin.format("weight"),
                                       scale.new_zeros(twin.history_len), scale.clone())
    return quantize_fp8(x, twin, "weight", scratch, backend)


def _local_shard(weight) -> Optional[torch.Tensor]:
    local = weight._local_tensor if isinstance(weight, DTensor) else weight
    return local._tensor if isinstance(local, FP8GatherWeight) else None


class WeightGather:
    """The FP8 all-gather casts of one prepared model, one step at a time (module docstring).
    ``new_step`` (run by ``StepSync`` after each sync) forgets the step's scales."""

    def __init__(self):
        self._layers = []
        self.new_step()

    def add(self, module: Linear) -> None:
        self._layers.append(weakref.ref(module))

    def layers(self):
        return [m for m in (r() for r in self._layers) if m is not None]

    def require_sharded(self) -> None:
        """RuntimeError unless FSDP2 manages every wrapped weight (DDP and one process would hand
        the layer the wrapper itself, which the GPU kernels cannot read)."""
        plain = [type(m).__name__ for m in self.layers() if not isinstance(m.weight, (DTensor, FP8Tensor))]
        if plain:
            raise RuntimeError(f"lowbit.distributed: fp8_all_gather=True is for FSDP2 (fully_shard), but {len(plain)} "
                               "wrapped weight(s) are not sharded; call fully_shard on the model, or prepare it "
                               "without fp8_all_gather (DDP, one process)")

    def new_step(self) -> None:
        self._scales, self._amax, self._begun = {}, {}, False

    # ---- the step's collective ------------------------------------------------------------
    def _needs_amax(self, m) -> bool:
        r = m.recipe
        return isinstance(r, Current) or (isinstance(r, Delayed) and r.amax_init and not m.lowbit_state.weight.primed)

    def _begin(self, mesh) -> None:
        """At the step's first all-gather: the local shard amaxes every tensorwise cast of the step
        needs (Current scales, the delayed cold start), all-reduced (MAX) in one collective."""
        if self._begun:
            return
        self._begun = True
        todo = [(m, s) for m in self.layers() if self._needs_amax(m) for s in [_local_shard(m.weight)] if s is not None]
        if todo:
            a = torch.stack([block_amax(s.detach(), TENSOR).float().reshape(()) for _, s in todo])
            all_reduce_max(mesh.get_group())(a)
            self._amax.update((id(m), v) for (m, _), v in zip(todo, a.unbind()))

    def _shard_amax(self, module, x: torch.Tensor, mesh) -> torch.Tensor:
        """The whole weight's amax in x's dtype (rounding is monotonic: amax(round(W)) = round(amax(W)))."""
        a = self._amax.get(id(module))
        if a is None:  # not sharded at the step's start (kept unsharded): its own collective
            a = block_amax(x.detach(), TENSOR).float().reshape(())
            all_reduce_max(mesh.get_group())(a)
            self._amax[id(module)] = a
        return a.to(x.dtype).float()

    # ---- FSDP2 extension ------------------------------------------------------------------
    def pre_all_gather(self, shard, mesh, orig_size, module, mp_policy):
        dtype = mp_policy.param_dtype or shard.dtype
        world = mesh.size()
        rows = -(-orig_size[0] // world)  # FSDP2's padded shard: ceil(N / world) rows
        x = shard.to(dtype)
        if x.shape[0] < rows:
            x = F.pad(x, (0, 0, 0, rows - x.shape[0]))
        recipe = module.recipe
        if shard.shape[1:] != orig_size[1:] or not fp8_gathered(recipe, orig_size[0], world):
            return (x,), ("hp",)  # sharded on dim 1, or blocks would straddle shards: high precision
        block = recipe.granularity("weight")
        backend = effective_backend(module.backend, x.device.type)
        if not block.is_tensorwise:
            q = quantize_fp8(x, recipe, "weight", None, backend)
            if world == 1:  # FSDP2 copies a lone rank's first input only: the scales travel as metadata
                return (q._data.view(torch.uint8),), ("block", q._data.dtype, block, q._scale)
            return (q._data.view(torch.uint8), q._scale), ("block", q._data.dtype, block)
        self._begin(mesh)
        scale = self._scales.get(id(module))
        st = module.lowbit_state.weight if isinstance(recipe, Delayed) else None
        if scale is None and st is not None:  # the step's cast: the state's scale, records the shard amax
            if not st.primed and recipe.amax_init:
                st.prime_amax(self._shard_amax(module, x, mesh))
            q = quantize_fp8(x, recipe, "weight", st, backend)
            self._scales[id(module)] = q._scale
        else:
            if scale is None:
                scale = recipe.scales(x, "weight", self._shard_amax(module, x, mesh))
                self._scales[id(module)] = scale
            q = _cast_with(x, recipe, scale, backend)
        return (q._data.view(torch.uint8),), ("tensor", q._data.dtype, q._scale)

    @staticmethod
    def post_all_gather(outputs, metadata, param_dtype, out=None):
        kind = metadata[0]
        if kind == "hp":
            return None if out is not None else (outputs[0], (outputs[0],))
        data = outputs[0].view(metadata[1])
        if kind == "tensor":
            if out is not None:
                out._scale = metadata[2]
                return None
            return FP8Tensor(data, metadata[2], TENSOR, param_dtype), (outputs[0],)
        lone = len(metadata) > 3  # one rank: the scales came as metadata
        if out is not None:
            if lone:
                out._scale = metadata[3]
            return None  # else data and block scales were gathered into the same buffers
        if lone:
            return FP8Tensor(data, metadata[3], metadata[2], param_dtype), (outputs[0],)
        return FP8Tensor(data, outputs[1], metadata[2], param_dtype), (outputs[0], outputs[1])


@FP8_OPS.implements(aten.as_strided.default)
def _fp8_leading_rows(func, types, args, kwargs):
    """The one ``as_strided`` FSDP2 takes of a gathered weight: its leading rows (the unpadded
    weight) of contiguous 2-D data, as a view of data and block scales."""
    x, size, stride = args[0], list(args[1]), list(args[2])
    offset = args[3] if len(args) > 3 else kwargs.get("storage_offset", 0)
    if not (x.dim() == 2 and len(size) == 2 and size[1] == x.shape[1] and size[0] <= x.shape[0]
            and stride == [x.shape[1], 1] and not offset and x._data.is_contiguous()):
        raise NotImplementedError(f"FP8Tensor.as_strided{(tuple(size), tuple(stride), offset)} on "
                                  f"{tuple(x.shape)}: only the leading rows of contiguous 2-D data")
    scale = x._scale
    if not x.block.is_tensorwise:
        scale = scale[: -(-size[0] // x.block.sizes(x.shape)[0])]
    return FP8Tensor(x._data[: size[0]], scale, x.block, x._orig_dtype)
