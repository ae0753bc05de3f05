"""StableHLO graphs as records: parse with IREE's MLIR bindings, inspect, slice, annotate distribution.

Op ids are positional (``op<i>``: the i-th operation of ``func.func @main``), so they are stable for a
given MLIR text. Edges are SSA values: a graph input is its declared name (``TensorSpec.name``, argument
i ↔ ``%arg<i>``); an internal edge is its SSA name (``%129``). Slicing works on the MLIR itself: it keeps
the ops between two op sets, turns every value flowing in from outside into a new argument, pulls in
the constants it needs, returns the chosen values, and re-parses the result so a slice is valid MLIR.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterable
from dataclasses import dataclass

from iree.compiler import ir

from node.workload.errors import InvalidObject, UnknownObject
from node.workload.model import Collective, Distribution, Graph, OpInfo, TensorSpec

ELEMENT_DTYPES = {"f64": "float64", "f32": "float32", "f16": "float16", "bf16": "bfloat16", "i64": "int64",
                  "i32": "int32", "i16": "int16", "i8": "int8", "ui64": "uint64", "ui32": "uint32",
                  "ui16": "uint16", "ui8": "uint8", "i1": "bool"}
MLIR_ELEMENTS = {v: k for k, v in ELEMENT_DTYPES.items()}
CONSTANT_OPS = frozenset({"stablehlo.constant", "arith.constant"})
_TENSOR = re.compile(r"^tensor<((?:\d+x)*)([a-z0-9]+)>$")


def parse_tensor_type(text: str) -> tuple[str, tuple[int, ...]]:
    """Return (dtype, shape) of a static MLIR tensor type such as ``tensor<1x7x128xf32>``."""
    match = _TENSOR.match(text.strip())
    if match is None or match.group(2) not in ELEMENT_DTYPES:
        raise InvalidObject(f"unsupported tensor type {text!r} (static shapes only)", obj=text)
    dims = tuple(int(d) for d in match.group(1).split("x") if d)
    return ELEMENT_DTYPES[match.group(2)], dims


def format_tensor_type(dtype: str, shape: tuple[int, ...]) -> str:
    """Return the MLIR tensor type for a dtype and shape."""
    return "tensor<" + "".join(f"{d}x" for d in shape) + MLIR_ELEMENTS[dtype] + ">"


@dataclass(frozen=True)
class ParsedModule:
    """What the record needs of one StableHLO module: its entry signature and its ops."""

    arg_types: tuple[str, ...]
    result_types: tuple[str, ...]
    ops: tuple[OpInfo, ...]
    op_text: tuple[str, ...]  # each op printed in the module's naming scope
    returned: tuple[str, ...]  # SSA names returned by main
    text: str  # the module as MLIR prints it (names renumbered): the canonical text of a graph


def _main_function(module: ir.Module) -> ir.Operation:
    for op in module.body.operations:
        if op.operation.name == "func.func" and str(op.attributes["sym_name"]) == '"main"':
            return op.operation
    raise InvalidObject("module has no func.func @main", obj="mlir")


def parse_module(text: str) -> ParsedModule:
    """Parse StableHLO text and return main's signature and ops (raises InvalidObject on bad MLIR)."""
    with ir.Context() as ctx:
        ctx.allow_unregistered_dialects = False
        try:
            module = ir.Module.parse(text)
        except ir.MLIRError as exc:
            raise InvalidObject(f"MLIR does not parse: {str(exc)[:300]}", obj="mlir") from exc
        main = _main_function(module)
        block = main.regions[0].blocks[0]
        arg_types = tuple(str(a.type) for a in block.arguments)
        ops: list[OpInfo] = []
        texts: list[str] = []
        returned: tuple[str, ...] = ()
        state = ir.AsmState(module.operation)  # one numbering for the module (per-call naming re-walks it: O(n²))
        for i, op in enumerate(block.operations):
            operation = op.operation
            if operation.name == "func.return":
                returned = tuple(v.get_name(state) for v in operation.operands)
                result_types = tuple(str(v.type) for v in operation.operands)
                continue
            ops.append(OpInfo(f"op{i}", operation.name, tuple(v.get_name(state) for v in operation.operands),
                              tuple(r.get_name(state) for r in operation.results),
                              tuple(str(r.type) for r in operation.results)))
            out = io.StringIO()
            operation.print(state, out)
            texts.append(out.getvalue())
        printed = str(module)
    return ParsedModule(arg_types, result_types, tuple(ops), tuple(texts), returned, printed)


def compute_mlir_bytecode(text: str) -> bytes:
    """Return the module as MLIR bytecode (the record keeps text and bytecode)."""
    with ir.Context():
        module = ir.Module.parse(text)
        out = io.BytesIO()
        module.operation.write_bytecode(out)
    return out.getvalue()


def build_graph(text: str, *, kind: str, name: str, input_names: list[str], input_roles: list[str],
                output_names: list[str], parent_id: str | None = None,
                distribution: Distribution | None = None, attrs: tuple[tuple[str, str], ...] = ()) -> Graph:
    """Return a Graph for StableHLO text, with its edges named and typed from the module itself."""
    parsed = parse_module(text)
    if len(input_names) != len(parsed.arg_types) or len(input_roles) != len(input_names):
        raise InvalidObject(f"{len(input_names)} input names for {len(parsed.arg_types)} arguments", obj=name)
    if len(output_names) != len(parsed.result_types):
        raise InvalidObject(f"{len(output_names)} output names for {len(parsed.result_types)} results", obj=name)
    inputs = tuple(TensorSpec(n, *parse_tensor_type(t), role)
                   for n, t, role in zip(input_names, parsed.arg_types, input_roles, strict=True))
    outputs = tuple(TensorSpec(n, *parse_tensor_type(t), "output")
                    for n, t in zip(output_names, parsed.result_types, strict=True))
    return Graph(kind, name, parsed.text, inputs, outputs, parsed.ops, parent_id, distribution, attrs)


def compute_value_specs(graph: Graph) -> dict[str, TensorSpec]:
    """Return every edge of a graph by binding name: inputs by name, internal values by SSA name."""
    specs = {s.name: s for s in graph.inputs}
    output_of = {v: s for v, s in zip(parse_module(graph.mlir).returned, graph.outputs, strict=True)}
    for op in graph.ops:
        for value, type_text in zip(op.results, op.result_types, strict=True):
            dtype, shape = parse_tensor_type(type_text)
            specs[value] = TensorSpec(value, dtype, shape, "output" if value in output_of else "activation")
    specs.update({s.name: s for s in graph.outputs})
    return specs


def compute_dependencies(graph: Graph) -> dict[str, set[str]]:
    """Return, for every op id, the ids of the ops whose results it uses."""
    producer = {value: op.op_id for op in graph.ops for value in op.results}
    return {op.op_id: {producer[v] for v in op.operands if v in producer} for op in graph.ops}


def compute_reachable(start: Iterable[str], edges: dict[str, set[str]]) -> set[str]:
    """Return the nodes reachable from start (inclusive) along edges."""
    seen, stack = set(start), list(start)
    while stack:
        for nxt in edges.get(stack.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return seen


def compute_ops_between(graph: Graph, from_ops: Iterable[str], to_ops: Iterable[str]) -> list[str]:
    """Return, in program order, the ops downstream of from_ops and upstream of to_ops (both inclusive)."""
    deps = compute_dependencies(graph)
    users: dict[str, set[str]] = {op_id: set() for op_id in deps}
    for op_id, used in deps.items():
        for u in used:
            users[u].add(op_id)
    start, end = list(from_ops), list(to_ops)
    for op_id in start + end:
        if op_id not in deps:
            raise UnknownObject(f"no op {op_id!r} in the graph", obj=graph.graph_id)
    keep = compute_reachable(start, users) & compute_reachable(end, deps)
    return [op.op_id for op in graph.ops if op.op_id in keep]


def compute_ops_upstream(graph: Graph, to_ops: Iterable[str], stop_values: Iterable[str] = ()) -> list[str]:
    """Return, in program order, every op that to_ops depend on (inclusive), not looking past stop_values.

    Without stop values the slice is fed by graph inputs only; a stop value (an SSA name) is a cut:
    the ops that produce it are left out and it becomes an input of the slice.
    """
    stops = set(stop_values)
    producer = {value: op.op_id for op in graph.ops for value in op.results}
    unknown = sorted(stops - set(producer))
    if unknown:
        raise UnknownObject(f"no value {unknown[0]!r} computed in the graph", obj=graph.graph_id)
    deps = {op.op_id: {producer[v] for v in op.operands if v in producer and v not in stops} for op in graph.ops}
    end = list(to_ops)
    for op_id in end:
        if op_id not in deps:
            raise UnknownObject(f"no op {op_id!r} in the graph", obj=graph.graph_id)
    keep = compute_reachable(end, deps)
    return [op.op_id for op in graph.ops if op.op_id in keep]


CUT_PREFIX = "cut:"  # a slice input cut from an internal edge of its parent: "cut:%71" is the parent's %71
OUT_PREFIX = "out:"  # a slice output that is an internal edge of its parent: "out:%40" is the parent's %40


def get_parent_edge(spec_name: str) -> str:
    """Return the parent graph's edge a slice edge stands for (its name without cut:/out:)."""
    for prefix in (CUT_PREFIX, OUT_PREFIX):
        if spec_name.startswith(prefix):
            return spec_name[len(prefix):]
    return spec_name


def compute_constant_values(parsed: ParsedModule) -> set[str]:
    """Return the SSA values computed from constants alone (no graph input upstream): foldable sub-graphs."""
    constant: set[str] = set()
    for op in parsed.ops:
        if all(v in constant for v in op.operands) and op.name != "func.call":
            constant.update(op.results)
    return constant


def compute_slice(graph: Graph, op_ids: Iterable[str], outputs: Iterable[str] | None = None,
                  name: str | None = None) -> Graph:
    """Return the subgraph of the given ops as a standalone logical graph linked to its source.

    Values flowing in from outside become arguments: graph inputs keep their names and roles; a cut
    internal edge gets the fresh name ``cut:<parent SSA name>`` (role "activation"), so no input shares
    a name with the slice's own (renumbered) SSA values. Every sub-graph computed from constants alone
    (a constant exponent broadcast to a shape, a causal mask) is carried into the slice, never made an
    input. ``outputs`` are parent SSA names to return (default: the results of the last kept op); one
    the parent returns keeps the parent's output name, any other is named ``out:<parent SSA name>``.
    """
    parsed = parse_module(graph.mlir)
    index = {op.op_id: i for i, op in enumerate(parsed.ops)}
    wanted = set(op_ids)
    unknown = wanted - set(index)
    if unknown:
        raise UnknownObject(f"ops not in the graph: {sorted(unknown)[:5]}", obj=graph.graph_id)
    if not wanted:
        raise InvalidObject("a slice needs at least one op", obj=graph.graph_id)
    producer = {value: op.op_id for op in parsed.ops for value in op.results}
    constant = compute_constant_values(parsed)
    kept = set(wanted)
    stack = [v for op_id in wanted for v in parsed.ops[index[op_id]].operands]
    while stack:  # carry in every constant sub-graph the kept ops read
        v = stack.pop()
        if v in constant and producer[v] not in kept:
            kept.add(producer[v])
            stack.extend(parsed.ops[index[producer[v]]].operands)
    ordered = sorted(kept, key=index.__getitem__)
    defined = {v for op_id in ordered for v in parsed.ops[index[op_id]].results}
    arg_name = {f"%arg{i}": spec for i, spec in enumerate(graph.inputs)}
    types = {f"%arg{i}": t for i, t in enumerate(parsed.arg_types)}
    types.update({v: t for op in parsed.ops for v, t in zip(op.results, op.result_types, strict=True)})
    cut: list[str] = []
    for op_id in ordered:
        for v in parsed.ops[index[op_id]].operands:
            if v not in defined and v not in cut:
                cut.append(v)
    returned = list(outputs) if outputs is not None else list(parsed.ops[index[ordered[-1]]].results)
    for v in returned:
        if v not in defined and v not in cut:
            raise UnknownObject(f"output {v!r} is not computed by the slice", obj=graph.graph_id)
    body = "\n".join("    " + parsed.op_text[index[op_id]] for op_id in ordered)
    args = ", ".join(f"{v}: {types[v]}" for v in cut)
    ret_types = ", ".join(types[v] for v in returned)
    text = (f"module {{\n  func.func @main({args}) -> ({ret_types}) {{\n{body}\n"
            f"    return {', '.join(returned)} : {ret_types}\n  }}\n}}\n")
    names = [arg_name[v].name if v in arg_name else CUT_PREFIX + v for v in cut]
    roles = [arg_name[v].role if v in arg_name else "activation" for v in cut]
    parent_output = {v: s.name for v, s in zip(parsed.returned, graph.outputs, strict=True)}
    output_names = [parent_output.get(v, arg_name[v].name if v in arg_name else OUT_PREFIX + v) for v in returned]
    if len(set(output_names)) != len(output_names):
        raise InvalidObject("a slice returns the same value twice", obj=graph.graph_id)
    return build_graph(text, kind="logical", name=name or f"{graph.name}[slice]", input_names=names,
                       input_roles=roles, output_names=output_names, parent_id=graph.graph_id,
                       attrs=(("slice_of", graph.graph_id), ("ops", ",".join(ordered))))


def compute_decoder_layer_cut(graph: Graph, layer: int, prefix: str = "model.layers") -> tuple[str, str]:
    """Return (hidden state entering, hidden state leaving) decoder layer ``layer`` of a Llama-style graph.

    Found from the layer's weights (graph inputs named ``<prefix>.<layer>.…``): each of the layer's two
    residual adds has one operand computed from its attention (``self_attn.o_proj``) or MLP
    (``mlp.down_proj``) weight and one (the residual stream) that is not.
    """
    specs = {s.name: f"%arg{i}" for i, s in enumerate(graph.inputs)}
    users: dict[str, list[OpInfo]] = {}
    for op in graph.ops:
        for v in op.operands:
            users.setdefault(v, []).append(op)

    def downstream(start: Iterable[str]) -> set[str]:
        seen, stack = set(start), list(start)
        while stack:
            for op in users.get(stack.pop(), ()):
                for r in op.results:
                    if r not in seen:
                        seen.add(r)
                        stack.append(r)
        return seen

    layer_args = [a for n, a in specs.items() if n.startswith(f"{prefix}.{layer}.")]
    if not layer_args:
        raise UnknownObject(f"no weights named {prefix}.{layer}.* in the graph", obj=graph.graph_id)
    of_layer = downstream(layer_args)

    def residual_add(weight: str) -> tuple[str, str]:
        arg = specs.get(f"{prefix}.{layer}.{weight}")
        if arg is None:
            raise UnknownObject(f"no weight {prefix}.{layer}.{weight}", obj=graph.graph_id)
        branch = downstream([arg])
        for op in graph.ops:
            if op.name == "stablehlo.add" and len(op.operands) == 2:
                a, b = op.operands
                if a in branch and b not in of_layer:
                    return b, op.results[0]
                if b in branch and a not in of_layer:
                    return a, op.results[0]
        raise UnknownObject(f"no residual add after {prefix}.{layer}.{weight}", obj=graph.graph_id)

    hidden_in, mid = residual_add("self_attn.o_proj.weight")
    of_layer.discard(mid)
    branch_mlp = downstream([specs.get(f"{prefix}.{layer}.mlp.down_proj.weight", "")])
    for op in graph.ops:
        if op.name == "stablehlo.add" and len(op.operands) == 2 and mid in op.operands:
            other = op.operands[1] if op.operands[0] == mid else op.operands[0]
            if other in branch_mlp:
                return hidden_in, op.results[0]
    raise UnknownObject(f"no residual add after {prefix}.{layer}.mlp.down_proj.weight", obj=graph.graph_id)


def compute_decoder_layer_slice(graph: Graph, layer: int, prefix: str = "model.layers") -> Graph:
    """Return decoder layer ``layer`` of a Llama-style graph as a slice: the hidden state entering it is cut.

    Inputs: ``cut:<hidden in>``, the layer's weights and whatever else the layer reads that is not
    downstream of the cut (the rotary frequencies); constants are carried. Output: ``out:<hidden out>``.
    """
    hidden_in, hidden_out = compute_decoder_layer_cut(graph, layer, prefix)
    producer = {value: op.op_id for op in graph.ops for value in op.results}
    ops = compute_ops_upstream(graph, [producer[hidden_out]], [hidden_in])
    return compute_slice(graph, ops, [hidden_out], name=f"{graph.name}[layer{layer}]")


def compute_all_reduce_graph(logical: Graph, output_names: list[str], replica_groups: tuple[tuple[int, ...], ...],
                             device_ids: tuple[str, ...], name: str | None = None) -> Graph:
    """Return the distributed graph of data-parallel replicas: the named outputs all-reduced (summed).

    Each named output (a gradient) is passed through a ``stablehlo.all_reduce`` with the replica
    groups, and the function returns the reduced values in its place.
    """
    parsed = parse_module(logical.mlir)
    by_name = {s.name: v for s, v in zip(logical.outputs, parsed.returned, strict=True)}
    unknown = sorted(set(output_names) - set(by_name))
    if unknown:
        raise UnknownObject(f"not outputs of the graph: {unknown}", obj=logical.graph_id)
    values = [by_name[n] for n in output_names]
    types = dict(zip(parsed.returned, parsed.result_types, strict=True))
    groups = ", ".join("[" + ", ".join(str(r) for r in g) + "]" for g in replica_groups)
    width = len(replica_groups[0]) if replica_groups else 0
    lines, reduced = [], {}
    for i, v in enumerate(values):
        dtype, _ = parse_tensor_type(types[v])
        scalar = f"tensor<{MLIR_ELEMENTS[dtype]}>"
        out = f"%allreduce{i}"
        reduced[v] = out
        lines.append(
            f'    {out} = "stablehlo.all_reduce"({v}) ({{\n'
            f"    ^bb0(%lhs{i}: {scalar}, %rhs{i}: {scalar}):\n"
            f"      %sum{i} = stablehlo.add %lhs{i}, %rhs{i} : {scalar}\n"
            f"      stablehlo.return %sum{i} : {scalar}\n"
            f"    }}) {{channel_handle = #stablehlo.channel_handle<handle = {i + 1}, type = 1>,"
            f" replica_groups = dense<[{groups}]> : tensor<{len(replica_groups)}x{width}xi64>,"
            f" use_global_device_ids}} : ({types[v]}) -> {types[v]}")
    ret = [reduced.get(v, v) for v in parsed.returned]
    text = _replace_body(logical.mlir, "\n".join(lines), ret, parsed.result_types)
    draft = build_graph(text, kind="logical", name="draft", input_names=[s.name for s in logical.inputs],
                        input_roles=[s.role for s in logical.inputs], output_names=[s.name for s in logical.outputs])
    reducers = [op.op_id for op in draft.ops if op.name == "stablehlo.all_reduce"]
    collectives = tuple(Collective(op_id, "all_reduce", n, replica_groups)
                        for op_id, n in zip(reducers, output_names, strict=True))
    distribution = Distribution(device_ids, replication=len(device_ids), collectives=collectives)
    return Graph("distributed", name or f"{logical.name}[dp{len(device_ids)}]", draft.mlir, draft.inputs,
                 draft.outputs, draft.ops, logical.graph_id, distribution)


def _replace_body(text: str, extra: str, returned: list[str], types: tuple[str, ...]) -> str:
    """Return main with extra lines inserted before a return of the given values."""
    start = text.rindex("return ")
    head, tail = text[:start], text[start:]
    tail = tail[tail.index("\n"):]
    return f"{head.rstrip()}\n{extra}\n    return {', '.join(returned)} : {', '.join(types)}{tail}"
