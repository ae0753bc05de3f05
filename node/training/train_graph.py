"""Export one replica's forward/backward (loss and per-parameter gradients) of a run's model as StableHLO.

torch.export cannot trace ``torch.func.grad`` or ``loss.backward()``, so the joint graph is built in two steps:
``torch.export.export`` traces the forward (parameters, buffers and the batch's token ids as positional inputs,
through the same ``functional_call`` lift as node.workload.export), then AOT autograd's
``aot_export_joint_simple(..., trace_joint=True)`` traces forward + backward of that ATen graph into one FX
graph, which torch-mlir's ``stateless_fx_import`` lowers to StableHLO (torch.export's own
``experimental._export_forward_backward`` fails on this model: "Found a parameter that did not receive a
gradient"). Three things had to change on the way (torch 2.13, torch-mlir, transformers 5.24; see
docs/training.md):

* attention is exported in its "eager" form (matmul, softmax, matmul) under an explicit additive causal mask:
  the SDPA kernel's backward (`_scaled_dot_product_flash_attention_for_cpu_backward`) has no torch-mlir
  lowering, and the mask builder transformers runs for `attention_mask=None` reads tensor data
  (`DataDependentOutputException` under AOT's fake tensors). Both forms compute the same causal attention;
  they differ only in floating-point order.
* `aten.slice_scatter` (the backward of rotate_half's slices) is decomposed into `cat` of narrowed slices:
  torch-mlir's StableHLO lowering of the sum of two slice_scatters ran out of memory (std::bad_alloc, > 12 GB).
* the backward's seed cotangent (AOT's `tangents_1`) is folded to the constant 1 and the `None` gradients
  of the non-differentiable inputs (rotary buffers, token ids) are dropped.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import torch
from torch._functorch.aot_autograd import aot_export_joint_simple
from torch.func import functional_call
from torch_mlir import fx
from torch_mlir.extras.fx_decomp_util import get_decomposition_table

from node.training.model import build_model
from node.training.spec import ModelShape, RunSpec
from node.workload.errors import InvalidObject
from node.workload.export import Exported, get_module_state
from node.workload.graph import build_graph
from node.workload.model import Graph

log = logging.getLogger(__name__)
GRAPH_NAME = "training.forward-backward"


def compute_slice_scatter(inp: torch.Tensor, src: torch.Tensor, dim: int = 0, start: int | None = None,
                          end: int | None = None, step: int = 1) -> torch.Tensor:
    """Return slice_scatter(inp, src, dim, start, end) as a cat of inp's narrowed ends around src (step 1)."""
    size = inp.shape[dim]
    lo = 0 if start is None else (start + size if start < 0 else start)
    hi = size if end is None else min(end + size if end < 0 else end, size)
    if step != 1:
        raise NotImplementedError("slice_scatter with a step other than 1")
    return torch.cat([inp.narrow(dim, 0, lo), src, inp.narrow(dim, hi, size - hi)], dim)


class _Loss(torch.nn.Module):
    """The declared causal-LM loss of one mini-batch, the model's state lifted to positional inputs."""

    def __init__(self, model: torch.nn.Module, state_names: list[str]) -> None:
        super().__init__()
        self.inner = [model]  # a list, so the model's parameters are not registered here
        self.state_names = state_names

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor]:
        state = dict(zip(self.state_names, args[:-1], strict=True))
        ids = args[-1]
        x, n = ids[:, :-1], ids.shape[1] - 1
        # an explicit additive causal mask (transformers' eager form): its own builder reads tensor data
        mask = torch.full((n, n), torch.finfo(torch.float32).min).triu(1)[None, None].expand(x.shape[0], 1, n, n)
        logits = functional_call(self.inner[0], state, (x,), {"use_cache": False, "attention_mask": mask}).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        return (loss,)


def _fold_seed_and_drop_none(gm: torch.fx.GraphModule) -> None:
    """Replace the backward's seed cotangent by the constant 1 and drop the None gradients from the outputs."""
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op == "placeholder" and node.name.startswith("tangents"):
            with graph.inserting_after(node):
                one = graph.call_function(torch.ops.aten.full.default, ([], 1.0), {"dtype": torch.float32})
            one.meta = dict(node.meta)
            node.replace_all_uses_with(one)
            graph.erase_node(node)
    out = next(n for n in graph.nodes if n.op == "output")
    out.args = (tuple(o for o in out.args[0] if o is not None),)
    gm.recompile()


def export_forward_backward(spec: RunSpec, *, attrs: tuple[tuple[str, str], ...] = ()) -> Exported:
    """Export one replica's forward/backward: (weights, buffers, input_ids) → (loss, grad.<param> …)."""
    model = build_model(spec)
    model.config._attn_implementation = "eager"  # SDPA's backward has no torch-mlir lowering (module doc)
    state = get_module_state(model)
    params = dict(model.named_parameters())  # tied lm_head/embedding once, as model.parameters()
    ids = torch.zeros((spec.batch_per_worker, spec.seq_len + 1), dtype=torch.long)
    names = [*state, "input_ids"]
    if "input_ids" in state:
        raise InvalidObject("a parameter is named input_ids", obj=GRAPH_NAME)
    args: list[Any] = [v.clone().requires_grad_(n in params) for n, v in state.items()] + [ids]
    program = torch.export.export(_Loss(model, list(state)), tuple(args), strict=False)
    decompositions = {**get_decomposition_table(),
                      torch.ops.aten.slice_scatter.default: compute_slice_scatter}
    gm = aot_export_joint_simple(program.module(), tuple(args), trace_joint=True, decompositions=decompositions)
    if not isinstance(gm, torch.fx.GraphModule):  # typed as a callable; AOT returns the joint FX graph
        raise InvalidObject(f"AOT autograd returned {type(gm).__name__}, not an FX graph", obj=GRAPH_NAME)
    _fold_seed_and_drop_none(gm)
    text = str(fx.stateless_fx_import(gm, output_type="stablehlo"))
    if "dense_resource" in text:
        raise InvalidObject("a tensor was baked into the graph as a constant", obj=GRAPH_NAME)
    roles = ["weight" if n in params else "state" for n in state] + ["input"]
    graph = build_graph(text, kind="logical", name=GRAPH_NAME, input_names=names, input_roles=roles,
                        output_names=["loss", *(f"grad.{n}" for n in params)], attrs=attrs)
    log.info("exported graph", extra={"graph": GRAPH_NAME, "graph_id": graph.graph_id, "ops": len(graph.ops)})
    return Exported(graph, {**state, "input_ids": ids})


@functools.lru_cache(maxsize=4)
def get_forward_backward_graph(shape: ModelShape, batch: int, seq_len: int,
                               attrs: tuple[tuple[str, str], ...] = ()) -> Graph:
    """Return the forward/backward graph of a shape and batch, exported once per process (SmolLM2's: minutes)."""
    return export_forward_backward(RunSpec(shape=shape, batch_per_worker=batch, seq_len=seq_len), attrs=attrs).graph
