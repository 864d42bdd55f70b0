"""Streamed weights for the oracle trace (trace.py): HF's fp32 model with its weights kept in the
checkpoint's memory-mapped bytes, each module's upcast made just before it runs.

The default of trace.py; --whole-model loads every weight in fp32 up front instead."""
import contextlib

import torch
from transformers import core_model_loading

from trace_families import Unsupported  # beside this file

# HF's fp32 model with its weights kept in the checkpoint's memory-mapped bytes, upcast per module.
# HF's own `from_pretrained(dtype=float32)` builds the model, renames and converts the checkpoint's
# keys, ties weights and computes every buffer (rotary inv_freq, embedding scales) exactly as in a
# plain fp32 load. Only one step differs: HF's per-tensor materialisation (`tensor[...]` on a
# safetensors mmap slice, then `.to(float32)`) keeps the slice's own dtype, so each weight stays a
# zero-copy view of the file mapping (file-backed pages, not private memory). Every parameter is
# then replaced by a NaN placeholder of its shape (one float, expanded) and the checkpoint view is
# kept aside; forward pre-hooks put the exact fp32 upcast (`view.to(float32)`, the value HF's fp32
# load gives) into a module just before it runs and forward hooks put the placeholder back after.
#
# Units: a decoder layer materialises its whole subtree; every other module with parameters of its
# own (embeddings, final norm, lm_head, projections) materialises just those. An nn.Embedding called
# with token ids gets a full-shape weight whose rows for those ids only are filled (the rest are
# never read, and an untouched torch.empty is not resident), so a 150k-row table costs a few rows.
# The other units take turns in one reused fp32 buffer (the arena, as large as the largest unit), so
# the private peak is max(largest decoder layer, lm_head) in fp32 plus the process, caches and the
# recorded tensors.
# A parameter read outside its module's forward reads NaN and the trace's finite check names it.
#
# HF's weight converters (e.g. per-expert tensors stacked into one for MoE) run on the checkpoint
# dtype here instead of fp32; they only move data (stack, concatenate, split, transpose), which
# commutes with an exact upcast. Such outputs are private copies in the checkpoint dtype.
# The trace test holds this to identical trace bytes against --whole-model on every twin.

class StreamedWeights:
    """The checkpoint views and the hooks that upcast them around each unit's forward."""

    def __init__(self, model, units):
        self.model = model
        self.sources = {}  # (module, name) -> checkpoint tensor (mmap view, or HF's own fp32)
        self.placeholders = {}
        self.live = 0  # bytes of fp32 weights materialised right now
        self.peak_live = 0
        self.arena_buf = torch.empty(0, dtype=torch.float32)
        for module in model.modules():
            for name, p in list(module._parameters.items()):
                if p is None:
                    continue
                if not p.is_floating_point():
                    raise Unsupported(f"parameter {name} of {type(module).__name__} is {p.dtype}, not floating point")
                self.sources[(module, name)] = p.detach()
                ph = self.placeholders.get(tuple(p.shape))
                if ph is None:
                    ph = torch.full((1,), float("nan"), dtype=torch.float32).expand(p.shape)
                    self.placeholders[tuple(p.shape)] = ph
                module._parameters[name] = torch.nn.Parameter(ph, requires_grad=False)
        in_unit = set()
        for unit in units:
            in_unit.update(unit.modules())
            self._hook(unit, list(unit.modules()))
        for module in model.modules():
            if module not in in_unit and any(p is not None for p in module._parameters.values()):
                self._hook(module, [module])

    def _arena(self, elements):
        """One fp32 buffer the units take turns to fill, grown to the largest unit: at real size a
        fresh allocation per tensor and step (~100 MB, above glibc's mmap threshold) is a new
        mapping whose pages fault in zeroed every time; a reused buffer pays that once."""
        if self.arena_buf.numel() < elements:
            self.arena_buf = torch.empty(0, dtype=torch.float32)  # drop the old one before growing
            self.arena_buf = torch.empty(elements, dtype=torch.float32)
        return self.arena_buf

    def _hook(self, unit, modules):
        owned = [(m, n) for m in modules for n in m._parameters if (m, n) in self.sources]
        if not owned:
            return
        rows = isinstance(unit, torch.nn.Embedding) and len(owned) == 1
        # What the arena holds for this unit: its upcast weights (an embedding's rows and fp32
        # sources, used as they are, need none). Fixed once the sources are known.
        need = 0 if rows else sum(self.sources[k].numel() for k in owned if self.sources[k].dtype != torch.float32)
        held = [0]

        def pre(mod, args, kwargs):
            ids = args[0] if args else kwargs.get("input")
            # Units do not nest in these models; one that did would get fresh memory, not the arena.
            arena = self._arena(need) if self.live == 0 and need else None
            at = 0
            for m, n in owned:
                src = self.sources[(m, n)]
                if rows and isinstance(ids, torch.Tensor) and not ids.is_floating_point():
                    w = torch.empty(src.shape, dtype=torch.float32)
                    used = ids.reshape(-1).unique()
                    w[used] = src[used].to(torch.float32)
                    size = used.numel() * src[0].numel() * 4
                elif src.dtype == torch.float32:
                    w, size = src, 0  # an fp32 checkpoint's own view, or a weight HF initialised itself
                elif arena is None:
                    w, size = src.to(torch.float32), src.numel() * 4
                else:  # copy_ upcasts exactly as .to(float32) does
                    w = arena[at:at + src.numel()].view(src.shape).copy_(src)
                    at, size = at + src.numel(), src.numel() * 4
                held[0] += size
                m._parameters[n] = torch.nn.Parameter(w, requires_grad=False)
            self.live += held[0]
            self.peak_live = max(self.peak_live, self.live)

        def post(mod, args, out):
            for m, n in owned:
                m._parameters[n] = torch.nn.Parameter(self.placeholders[tuple(m._parameters[n].shape)], requires_grad=False)
            self.live -= held[0]
            held[0] = 0

        unit.register_forward_pre_hook(pre, with_kwargs=True)
        unit.register_forward_hook(post)


@contextlib.contextmanager
def checkpoint_dtype_views():
    """While active, HF's loader keeps each checkpoint tensor as the mmap view it sliced."""
    original = core_model_loading._materialize_copy

    def keep_dtype(tensor, device=None, dtype=None):
        return original(tensor, device, None)

    core_model_loading._materialize_copy = keep_dtype
    try:
        yield
    finally:
        core_model_loading._materialize_copy = original


def load_streamed(auto, model_dir, units_of):
    """HF's fp32 model of model_dir with streamed weights; units_of(model) names the decoder layers."""
    with checkpoint_dtype_views():
        model = auto.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    return model, StreamedWeights(model, list(units_of(model)))
