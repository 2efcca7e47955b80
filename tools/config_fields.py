"""Which KubeletConfiguration fields klet code reads, and whether klet.config.support agrees.

A field counts as read only where code loads its value from an expression that holds the
configuration, found by an AST walk of libs/ and services/ (leaving out the config
package's declaration, flag, validation and support modules, which touch every field
without acting on any; decoding.py stays in: its defaulting is what some fields do).
An expression holds the configuration, or one of its nested blocks, when it is

- a name annotated with a configuration type: `KubeletConfiguration`, a nested block's
  class (`KubeletAuthentication`, ...), or a `Protocol` declared in the sources whose
  members are all fields of one of those (`class LogConfig(Protocol)` with
  `container_log_max_size`, ...), as a parameter or an annotated assignment;
- an attribute that some class in the sources declares with such a type
  (`Settings.kubelet: KubeletConfiguration`, a protocol's `def kubelet(self) ->
  SourceSettings`), loaded from anything: `settings.kubelet`, `deps.settings.kubelet`;
- a name assigned from one of those (`k = settings.kubelet`, `kubelet, klet =
  settings.kubelet, settings.klet`, `auth = k.authentication`, `cfg, problems =
  read_config_file(path)` by the callee's return annotation, `KubeletConfiguration()`),
  in the same function or an enclosing one.

A parameter annotated `object` or `Any` holds nothing, whatever its callers pass: a
reader must say by its annotation (a Protocol of the fields it needs is enough) that it
reads the configuration.

Then `cfg.authentication.webhook.cache_ttl` reads that leaf, `getattr(cfg, "x")` with a
literal reads `x`, and a property of the configuration class
(`effective_image_service_endpoint`) reads what its body reads from `self`. A feature
gate is read where code indexes or calls `.get` on `featureGates` with a literal or a
module-level string constant (`k.feature_gates.get(EVENTED_PLEG_GATE, True)`), or
passes it to `klet.config.gates.enabled` (`enabled(k.feature_gates, "SystemdWatchdog")`).

Names alone never count: `run_once()` methods do not read `runOnce`. The walk can still
over-count where a configuration-typed attribute name (`kubelet`) or a function whose
return annotation is a configuration type is shared by unrelated code; it never counts a
field that no expression of a configuration type reaches.

`check()` compares the result with `klet.config.support`. A field no code reads must be
refused unless it holds a value klet implements (UNIMPLEMENTED), have no effect in any
configuration klet accepts (NO_EFFECT: tied to a refused field or an unhonoured gate
that is off by default, or read nowhere upstream either), or be a default klet does not
honour, warned about at start (NOT_HONOURED); anything else accepted and read by nothing
is a failure, and so is a field listed there that code reads. The feature gates code
reads must be those klet.config.gates says klet honours, and no others. The unit test
tests/unit/test_config_support.py runs `check()`; `main()` prints the tables for the
README: `.venv/bin/python tools/config_fields.py`.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

from klet.config import gates, support
from klet.config.kubelet import KubeletConfiguration, nested_class
from klet.model.layout import DEFAULT_SERVICE_PORTS

ROOT = Path(__file__).resolve().parent.parent
SERVICES = frozenset(DEFAULT_SERVICE_PORTS)
# Modules that name every field without implementing any.
SKIP = {
    "libs/src/klet/config/kubelet.py",
    "libs/src/klet/config/flags.py",
    "libs/src/klet/config/validation.py",
    "libs/src/klet/config/support.py",
    "libs/src/klet/config/gates.py",
    "libs/src/klet/config/gatelist.py",
}


def sources(root: Path = ROOT) -> Iterator[Path]:
    for base in [root / "libs" / "src", *(root / "services").glob("*/src")]:
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel not in SKIP and "/rpc/gen/" not in rel:
                yield path


# --- the configuration's classes ---------------------------------------------------------


class Block(NamedTuple):
    """A configuration class and the upstream dotted path of where it sits ("" = root)."""

    cls: type[Any]
    prefix: str

    def fields(self) -> dict[str, dataclasses.Field[Any]]:
        return {f.name: f for f in dataclasses.fields(self.cls)}


def _blocks(cls: type[Any] = KubeletConfiguration, prefix: str = "") -> Iterator[Block]:
    yield Block(cls, prefix)
    for f in dataclasses.fields(cls):
        if f.metadata["kind"] == "nested":
            yield from _blocks(nested_class(f), prefix + f.metadata["json"] + ".")


BLOCKS: dict[str, Block] = {b.cls.__name__: b for b in _blocks()}


def _properties(cls: type[Any]) -> dict[str, frozenset[str]]:
    """Property name -> the field names its body loads from `self`."""
    out: dict[str, frozenset[str]] = {}
    for name, member in vars(cls).items():
        if isinstance(member, property) and member.fget is not None:
            tree = ast.parse(textwrap.dedent(inspect.getsource(member.fget)))
            out[name] = frozenset(
                n.attr
                for n in ast.walk(tree)
                if isinstance(n, ast.Attribute)
                and isinstance(n.value, ast.Name)
                and n.value.id == "self"
            )
    return out


PROPERTIES: dict[type[Any], dict[str, frozenset[str]]] = {
    b.cls: _properties(b.cls) for b in BLOCKS.values()
}


# --- the walk ----------------------------------------------------------------------------


@dataclasses.dataclass
class Reads:
    """What the walk found: field paths and gate names read."""

    fields: set[str] = dataclasses.field(default_factory=set)
    gates: set[str] = dataclasses.field(default_factory=set)


def _annotation_names(node: ast.expr | None) -> Iterator[str]:
    """The class names an annotation mentions (`X`, `mod.X`, `X | None`, `"X"`, Optional[X])."""
    if node is None:
        return
    if isinstance(node, ast.Name):
        yield node.id
    elif isinstance(node, ast.Attribute):
        yield node.attr
    elif isinstance(node, ast.BinOp):
        yield from _annotation_names(node.left)
        yield from _annotation_names(node.right)
    elif isinstance(node, ast.Subscript):
        yield from _annotation_names(node.slice)
    elif isinstance(node, ast.Tuple):
        for elt in node.elts:
            yield from _annotation_names(elt)
    elif isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            yield from _annotation_names(ast.parse(node.value, mode="eval").body)
        except SyntaxError:
            return


def _is_protocol(node: ast.ClassDef) -> bool:
    return any(name == "Protocol" for base in node.bases for name in _annotation_names(base))


def _members(node: ast.ClassDef) -> set[str]:
    out: set[str] = set()
    for stmt in node.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            out.add(stmt.target.id)
        elif isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            if not stmt.name.startswith("__"):
                out.add(stmt.name)
    return out


class Program:
    """Every module of the sources, parsed once, with what is global to the walk."""

    def __init__(self, paths: Iterable[Path]) -> None:
        self.trees = [ast.parse(p.read_text(), str(p)) for p in paths]
        self.types: dict[str, Block] = dict(BLOCKS)  # annotation name -> block
        self.typed_attrs: dict[str, Block] = {}  # attribute name -> block it holds
        self.functions: dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]] = {}
        classes = [n for t in self.trees for n in ast.walk(t) if isinstance(n, ast.ClassDef)]
        for node in classes:
            if _is_protocol(node):
                block = self._satisfied_by(_members(node))
                if block is not None:
                    self.types.setdefault(node.name, block)
        for node in classes:
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    block = self.block_of(stmt.annotation)
                    if block is not None:
                        self.typed_attrs[stmt.target.id] = block
                elif isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
                    block = self.block_of(stmt.returns)
                    if block is not None:
                        self.typed_attrs[stmt.name] = block
        for tree in self.trees:
            for n in ast.walk(tree):
                if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef):
                    self.functions.setdefault(n.name, []).append(n)

    def _satisfied_by(self, members: set[str]) -> Block | None:
        if not members:
            return None
        for block in BLOCKS.values():
            known = set(block.fields()) | set(PROPERTIES[block.cls])
            if members <= known:
                return block
        return None

    def block_of(self, annotation: ast.expr | None) -> Block | None:
        for name in _annotation_names(annotation):
            if name in self.types:
                return self.types[name]
        return None

    def _callees(self, call: ast.Call) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
        func = call.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
        return self.functions.get(name or "", [])

    def returned(self, call: ast.Call) -> ast.expr | None:
        """The return annotation of the function a call names, when all of that name agree."""
        callees = self._callees(call)
        returns = {ast.dump(f.returns) for f in callees if f.returns is not None}
        if len(returns) != 1 or callees[0].returns is None:
            return None
        return callees[0].returns

    def returned_tuple(self, call: ast.Call) -> list[ast.expr]:
        """The element annotations of a `tuple[...]` the called function returns."""
        returns = self.returned(call)
        if isinstance(returns, ast.Subscript) and isinstance(returns.slice, ast.Tuple):
            return list(returns.slice.elts)
        return []

    def walk(self) -> Reads:
        reads = Reads()
        for tree in self.trees:
            _Module(self, tree, reads).run()
        return reads


class _Module:
    def __init__(self, program: Program, tree: ast.Module, reads: Reads) -> None:
        self.p = program
        self.tree = tree
        self.reads = reads
        self.constants = {
            t.id: s.value.value
            for s in tree.body
            if isinstance(s, ast.Assign | ast.AnnAssign)
            and isinstance(s.value, ast.Constant)
            and isinstance(s.value.value, str)
            for t in (s.targets if isinstance(s, ast.Assign) else [s.target])
            if isinstance(t, ast.Name)
        }

    def run(self) -> None:
        self.scope(self.tree.body, {}, None)

    # A scope's environment is flow-insensitive: every binding in the body counts
    # everywhere in it, found by repeating the pass until it stops growing.
    def scope(
        self,
        body: list[ast.stmt],
        outer: dict[str, Block],
        func: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | None,
    ) -> None:
        env = dict(outer)
        if isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            self.bind_parameters(func, env)
        nodes = [n for stmt in body for n in _own_nodes(stmt)]
        while True:
            size = len(env)
            for node in nodes:
                self.bind(node, env)
            if len(env) == size:
                break
        for node in nodes:
            self.use(node, env)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                self.scope(node.body, env, node)
            elif isinstance(node, ast.Lambda):
                self.scope([ast.Expr(node.body)], env, node)
            elif isinstance(node, ast.ClassDef):
                self.scope(node.body, env, None)

    def bind_parameters(
        self, func: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda, env: dict[str, Block]
    ) -> None:
        args = func.args
        for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
            block = self.p.block_of(arg.annotation)
            if block is not None:
                env[arg.arg] = block

    def bind(self, node: ast.AST, env: dict[str, Block]) -> None:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            block = self.p.block_of(node.annotation) or (
                self.resolve(node.value, env) if node.value is not None else None
            )
            if block is not None:
                env[node.target.id] = block
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                self.bind_target(target, node.value, env)
        elif isinstance(node, ast.NamedExpr):
            self.bind_target(node.target, node.value, env)

    def bind_target(self, target: ast.expr, value: ast.expr, env: dict[str, Block]) -> None:
        if isinstance(target, ast.Name):
            block = self.resolve(value, env)
            if block is not None:
                env[target.id] = block
        elif isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple):
            for t, v in zip(target.elts, value.elts, strict=False):
                self.bind_target(t, v, env)
        elif isinstance(target, ast.Tuple) and isinstance(value, ast.Call):
            # `cfg, problems = read_config_file(path)`: the callee's `tuple[...]` return
            for t, annotation in zip(target.elts, self.p.returned_tuple(value), strict=False):
                block = self.p.block_of(annotation)
                if isinstance(t, ast.Name) and block is not None:
                    env[t.id] = block

    def resolve(self, node: ast.expr, env: dict[str, Block]) -> Block | None:
        """The configuration block `node` holds, recording the field it reads, if any."""
        if isinstance(node, ast.Name):
            return env.get(node.id)
        attr: str | None = None
        base: ast.expr | None = None
        if isinstance(node, ast.Attribute):
            attr, base = node.attr, node.value
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "getattr"
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            attr, base = node.args[1].value, node.args[0]
        if isinstance(node, ast.Call) and attr is None:
            # a configuration class built, or a function annotated to return one
            if isinstance(node.func, ast.Name) and node.func.id in BLOCKS:
                return BLOCKS[node.func.id]
            return self.p.block_of(self.p.returned(node))
        if attr is None or base is None:
            return None
        holder = self.resolve(base, env)
        if holder is None:
            return self.p.typed_attrs.get(attr) if isinstance(node, ast.Attribute) else None
        return self.read(holder, attr)

    def read(self, holder: Block, attr: str) -> Block | None:
        f = holder.fields().get(attr)
        if f is None:
            for name in PROPERTIES[holder.cls].get(attr, ()):
                self.read(holder, name)
            return None
        path = holder.prefix + f.metadata["json"]
        if f.metadata["kind"] == "nested" and f.default is not None:
            return Block(nested_class(f), path + ".")
        self.reads.fields.add(path)
        if f.metadata["kind"] == "nested":  # an optional block counts as itself
            return Block(nested_class(f), path + ".")
        return None

    def gate_name(self, node: ast.expr) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name):
            return self.constants.get(node.id)
        return None

    def use(self, node: ast.AST, env: dict[str, Block]) -> None:
        """Record the reads in one node (its sub-expressions are visited separately)."""
        if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load)) or isinstance(
            node, ast.Call
        ):
            self.resolve(node, env)
        if isinstance(node, ast.Call):
            self.gate_call(node, env)
        elif isinstance(node, ast.Subscript) and self.is_gates(node.value, env):
            name = self.gate_name(node.slice)
            if name is not None:
                self.reads.gates.add(name)

    def is_gates(self, node: ast.expr, env: dict[str, Block]) -> bool:
        if not (isinstance(node, ast.Attribute) and node.attr == "feature_gates"):
            return False
        holder = self.resolve(node.value, env)
        return holder is not None and holder.cls is KubeletConfiguration

    def gate_call(self, node: ast.Call, env: dict[str, Block]) -> None:
        func = node.func
        if (
            isinstance(func, ast.Attribute)
            and func.attr == "get"
            and self.is_gates(func.value, env)
            and node.args
        ):
            name = self.gate_name(node.args[0])
            if name is not None:
                self.reads.gates.add(name)
        elif (
            isinstance(func, ast.Name | ast.Attribute)
            and (func.id if isinstance(func, ast.Name) else func.attr) == "enabled"
            and len(node.args) == 2
            and self.is_gates(node.args[0], env)
        ):
            # klet.config.gates.enabled(k.feature_gates, NAME): klet's default applied
            name = self.gate_name(node.args[1])
            if name is not None:
                self.reads.gates.add(name)


def _own_nodes(stmt: ast.stmt) -> Iterator[ast.AST]:
    """The nodes of a statement that belong to its scope: nested function, lambda and
    class bodies are yielded as the nested node only (their insides are a scope of their
    own)."""
    stack: list[ast.AST] = [stmt]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            stack.extend(node.decorator_list)
            stack.extend(node.args.defaults)
            stack.extend(d for d in node.args.kw_defaults if d is not None)
            continue
        if isinstance(node, ast.Lambda | ast.ClassDef):
            if isinstance(node, ast.ClassDef):
                stack.extend(node.decorator_list)
                stack.extend(node.bases)
            continue
        stack.extend(ast.iter_child_nodes(node))


# --- the comparison with klet.config.support ------------------------------------------------


@functools.cache
def reads(root: Path = ROOT) -> Reads:
    return Program(sources(root)).walk()


def unread_fields(root: Path = ROOT) -> list[str]:
    """Every leaf field path (as `support.all_paths` counts them) no code reads."""
    read = reads(root).fields
    return [path for path in support.all_paths() if path not in read]


def check(root: Path = ROOT) -> list[str]:
    """Disagreements between the code and klet.config.support (empty when consistent)."""
    unread = set(unread_fields(root))
    listed = {*support.UNIMPLEMENTED, *support.NO_EFFECT, *support.NOT_HONOURED}
    problems = []
    for path in sorted(unread - listed):
        problems.append(
            f"{path}: accepted, but read by nothing: implement it, or list it in "
            "klet.config.support"
        )
    for path in sorted(set(support.UNIMPLEMENTED) - unread):
        if support.UNIMPLEMENTED[path].partial:
            continue
        problems.append(f"{path}: refused as unimplemented, but some code reads it now")
    for path in sorted((set(support.NO_EFFECT) | set(support.NOT_HONOURED)) - unread):
        problems.append(f"{path}: listed as not acted on, but some code reads it now")
    for path, rule in support.NO_EFFECT.items():
        problem = _governing_problem(rule.unless)
        if problem:
            problems.append(f"{path}: has no effect unless {rule.unless}, but {problem}")
    for path, honour in support.NOT_HONOURED.items():
        _, default = support.field_value(KubeletConfiguration(), path)
        if honour.implemented == default:
            problems.append(f"{path}: klet implements the default; it is not NOT_HONOURED")
        if honour.service not in SERVICES:
            problems.append(f"{path}: no service {honour.service!r}")
    read_gates = reads(root).gates
    for name in sorted(set(gates.HONOURED) - read_gates):
        problems.append(f"featureGates.{name}: listed as honoured but read by nothing")
    for name in sorted(read_gates - set(gates.HONOURED)):
        problems.append(
            f"featureGates.{name}: read, but refused away from its default (not in "
            "klet.config.gates.HONOURED)"
        )
    known = set(support.all_paths())
    for path in sorted(listed - known):
        problems.append(f"{path}: listed in klet.config.support but not a field")
    for path in sorted(
        set(support.UNIMPLEMENTED) & (set(support.NO_EFFECT) | set(support.NOT_HONOURED))
    ):
        problems.append(f"{path}: listed twice in klet.config.support")
    return problems


def _governing_problem(unless: str | None) -> str:
    """Why the field or gate a NO_EFFECT entry names would not keep it inert; "" if it does."""
    if unless is None:
        return ""
    if unless.startswith("featureGates."):
        name = unless.removeprefix("featureGates.")
        if name not in gates.GATES:
            return "no such gate"
        if name in gates.HONOURED or gates.GATES[name][0]:
            return "klet accepts that gate on"
        return ""
    rule = support.UNIMPLEMENTED.get(unless)
    if rule is None or rule.partial:
        return "klet does not refuse that field away from its default"
    return ""


def _show(value: object) -> str:
    return "the default" if value is support.DEFAULT else repr(value)


def main() -> None:
    problems = check()
    print("# KubeletConfiguration fields klet refuses unless left at the default")
    for path, rule in support.UNIMPLEMENTED.items():
        values = ", ".join(_show(a) for a in rule.allowed) if rule.check is None else rule.shown
        print(f"{path}\t{rule.reason}\taccepted: {values}")
    print("# fields without effect in any configuration klet accepts, as upstream")
    for path, no_effect in support.NO_EFFECT.items():
        unless = f" (refused: {no_effect.unless} away from its default)" if no_effect.unless else ""
        print(f"{path}\t{no_effect.reason}{unless}")
    print("# fields whose upstream default klet does not honour (a WARNING at start)")
    for path, honour in support.NOT_HONOURED.items():
        print(f"{path}\t{honour.reason}\t{honour.service} warns unless: {honour.implemented!r}")
    if problems:
        print("# inconsistencies (fix klet.config.support)")
        for problem in problems:
            print(problem)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
