"""Hugging Face models on lowbit's FP8 attention: the attention implementation named "lowbit".

``route_attention(model, recipe)`` (what ``lowbit.convert(..., attention=True)`` calls) registers
``hf_attention_forward`` with ``transformers.AttentionInterface`` under "lowbit" (and torch SDPA's
mask builder under the same name with ``AttentionMaskInterface``, so Hugging Face builds the masks
it would build for "sdpa": none for plain causal batches, a boolean mask where padding or a
sliding window needs one), stores the recipe's fields on every config of the model
(``config.lowbit_attention``, plain ints and bools, so ``save_pretrained`` still writes JSON) and
switches the model with ``model.set_attn_implementation("lowbit")`` (``config._attn_implementation``
where a transformers version has no such method). ``unroute_attention`` restores the previous
implementation. Models that are not Hugging Face ``PreTrainedModel``s are left alone with a
warning: lowbit patches no global function; call ``lowbit.nn.functional.scaled_dot_product_attention``
in such a model's forward instead.

``hf_attention_forward`` mirrors transformers' own "sdpa" function: query/key/value ``(B, H, S, D)``
(key/value heads fewer for GQA, handled in the kernels), ``is_causal`` from the call or the
module, causal only when no mask is given and there is more than one query; it returns
``(B, S, H, D)``. Masks (padding, sliding windows) and dropout reach
``scaled_dot_product_attention``, which falls back to torch's SDPA for them with a warning.
"""
from __future__ import annotations

import dataclasses
import warnings

import torch

from ..scaling.attention import AttentionRecipe
from .attention import scaled_dot_product_attention

__all__ = ["hf_attention_forward", "route_attention", "unroute_attention", "IMPLEMENTATION", "CONFIG_KEY"]

IMPLEMENTATION = "lowbit"
CONFIG_KEY = "lowbit_attention"
_PREVIOUS_KEY = "lowbit_attention_previous"


def _recipe_of(module) -> AttentionRecipe:
    fields = getattr(getattr(module, "config", None), CONFIG_KEY, None)
    return AttentionRecipe(**fields) if fields else AttentionRecipe()


def hf_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                         is_causal=None, **kwargs):
    """The "lowbit" entry of ``transformers.AttentionInterface`` (module docstring)."""
    q_len = query.shape[2]
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    is_causal = bool(q_len > 1 and attention_mask is None and is_causal)
    if is_causal and key.shape[2] > q_len:  # prefill into a longer (static) cache: the rest is masked
        key, value = key[:, :, :q_len], value[:, :, :q_len]
    out = scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                       is_causal=is_causal, scale=scaling, enable_gqa=query.shape[1] != key.shape[1],
                                       recipe=_recipe_of(module))
    return out.transpose(1, 2).contiguous(), None


def _is_hf_model(model) -> bool:
    try:
        from transformers import PreTrainedModel
    except ImportError:
        return False
    return isinstance(model, PreTrainedModel)


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    AttentionInterface.register(IMPLEMENTATION, hf_attention_forward)
    AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)


def _configs(model):
    seen = {}
    for m in model.modules():
        cfg = getattr(m, "config", None)
        if cfg is not None and hasattr(cfg, "_attn_implementation"):
            seen[id(cfg)] = cfg
    return list(seen.values())


def _set_implementation(model, name: str) -> None:
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(name)
    else:
        model.config._attn_implementation = name


def route_attention(model: torch.nn.Module, recipe: AttentionRecipe) -> bool:
    """Route ``model``'s attention to lowbit (module docstring); False (and a warning) if it can't."""
    if not isinstance(recipe, AttentionRecipe):
        raise TypeError(f"attention recipe must be a lowbit.scaling.AttentionRecipe, got {recipe!r}")
    if not _is_hf_model(model):
        warnings.warn(f"lowbit.convert(attention=True): {type(model).__name__} is not a Hugging Face PreTrainedModel, "
                      "so its attention is not routed (lowbit patches no global function); call "
                      "lowbit.nn.functional.scaled_dot_product_attention in its forward instead", stacklevel=3)
        return False
    _register()
    previous = model.config._attn_implementation
    fields = dataclasses.asdict(recipe)
    for cfg in _configs(model):
        if getattr(cfg, CONFIG_KEY, None) is None:
            setattr(cfg, _PREVIOUS_KEY, cfg._attn_implementation)
        setattr(cfg, CONFIG_KEY, fields)
    if previous != IMPLEMENTATION:
        _set_implementation(model, IMPLEMENTATION)
    return True


def unroute_attention(model: torch.nn.Module) -> None:
    """Undo ``route_attention``: the implementation the model had before, the recipe fields removed."""
    if not _is_hf_model(model) or getattr(model.config, CONFIG_KEY, None) is None:
        return
    previous = getattr(model.config, _PREVIOUS_KEY, None) or "sdpa"
    for cfg in _configs(model):
        for key in (CONFIG_KEY, _PREVIOUS_KEY):
            if hasattr(cfg, key):
                delattr(cfg, key)
    _set_implementation(model, previous)
