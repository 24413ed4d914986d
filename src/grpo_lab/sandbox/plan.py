"""How a problem's tests are run: which statements are tests, what they take from the completion, what is theirs.

Planned once per problem, on the trainer's side, from the tests' source (and the problem's preamble): the judge
runs the plan; nothing here runs any code. Every common layout is understood:

* top-level asserts: each top-level statement that asserts (an ``assert``, or a loop or branch holding one) is a
  test; anything else is setup, run in order (a setup statement that fails fails the tests after it);
* ``def check(fn): <asserts>`` and its call ``check(double)`` in the file, or HumanEval's ``check(candidate)``
  with an entry point, whatever the parameter's name: each asserting statement of ``check``'s body is a test, with
  the parameter bound to the completion's function (a body that cannot stand alone, with a ``return``, is one test);
* MBPP's ``test_list`` with its ``test_setup_code``: setup lines, then assert lines.

What the tests use is theirs: builtins, the standard-library modules they name, and the problem's own helpers (the
preamble's functions that have a body, such as HumanEval's ``poly``) come from the judge's side; only the other
names (the entry point, a function MBPP's asserts call) are taken from the completion. An ``assert True`` tests
nothing and is skipped; an assert that uses nothing of the completion's (it would pass for an empty answer) is
refused when the problem loads.
"""

from __future__ import annotations

import ast
import builtins
import copy
import sys
from collections.abc import Iterable
from dataclasses import dataclass

from grpo_lab.errors import GrpoLabError


class SandboxError(GrpoLabError):
    """The sandbox cannot run here, or a problem's tests cannot be run (they do not parse, or test nothing)."""


_BUILTINS = frozenset(dir(builtins))
_MODULES = frozenset(sys.stdlib_module_names)


# Names tests use without importing them, which the judge imports itself (never the completion's own), unless the
# completion is to define them: classes of the standard library a test builds its expected values with.
_TYPING = ("List", "Dict", "Tuple", "Set", "FrozenSet", "Optional", "Union", "Any", "Callable", "Iterable", "Iterator")
_IMPORTED = {
    **dict.fromkeys(("Counter", "OrderedDict", "defaultdict", "deque", "namedtuple", "ChainMap"), "collections"),
    "Fraction": "fractions",
    "Decimal": "decimal",
    **dict.fromkeys(_TYPING, "typing"),
}


@dataclass(frozen=True)
class Plan:
    segments: tuple[tuple[str, bool], ...]  # (source, is it a test?), run in order by the judge
    total: int  # the tests among them
    names: tuple[str, ...]  # what the tests take from the completion
    modules: tuple[str, ...]  # standard-library modules the tests use without importing them
    preamble: str | None  # the problem's own code, run on the judge's side for its helpers
    stubs: tuple[str, ...]  # functions the preamble only declares: the completion must define them itself
    imported: tuple[tuple[str, str], ...] = ()  # (name, module): standard-library names the tests use unimported

    def undefined_stubs(self, code: str) -> tuple[str, ...]:
        """The stubs ``code`` (the completion, after the preamble) does not define: a completion that adds no
        statement of its own to the stub must not be tested as the stub (which returns None)."""
        if not self.stubs or self.preamble is None:
            return ()
        source, first = program(self.preamble, code)
        try:
            module = ast.parse(source)
        except (SyntaxError, ValueError, MemoryError, RecursionError):
            return ()  # the completion's own sandbox reports the syntax error
        defined = set()
        for node in module.body:
            if node.lineno >= first:
                defined |= _stored(node)
            elif (
                isinstance(node, ast.FunctionDef)
                and node.name in self.stubs
                and any(statement.lineno >= first for statement in node.body)  # a body written after the stub
            ):
                defined.add(node.name)
        return tuple(name for name in self.stubs if name not in defined)


def program(preamble: str | None, code: str) -> tuple[str, int]:
    """The completion's program: the problem's preamble, then its code (so that it may give only the body of the
    preamble's stub), and the line its code starts on. Its ``from __future__`` imports, which Python takes only at
    the top of a file, go first (their own lines left blank, so that its line numbers hold)."""
    if not preamble:
        return code, 1
    lines = code.splitlines(keepends=True)
    head = []
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        tree = None  # a body-only answer does not parse alone: nothing of it to move
    for node in tree.body if tree is not None else ():
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            head.append(ast.unparse(node) + "\n")
            for i in range(node.lineno - 1, node.end_lineno):
                lines[i] = "\n"
    return f"{''.join(head)}{preamble}\n{''.join(lines)}", len(head) + preamble.count("\n") + 2


def plan(tests: str, entry_point: str | None = None, preamble: str | None = None) -> Plan:
    """The plan of `tests` (see the module docstring); a one-line :class:`SandboxError` when they cannot be run."""
    module = _parse(tests, "the tests")
    if entry_point is not None and not entry_point.isidentifier():
        raise SandboxError(f"entry_point={entry_point!r} is not a Python name")
    checks = [n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == "check"]
    check = checks[-1] if checks else None
    if entry_point is not None and check is None:
        raise SandboxError(f"entry_point={entry_point!r} needs tests that define check(candidate)")
    if check is not None and len(check.args.args) != 1:
        raise SandboxError("check() must take one parameter: the function it tests")
    layout = _Layout(check)
    for node in module.body:
        layout.add(node, checks)
    if entry_point is not None and entry_point not in layout.entries:
        layout.add_check(entry_point)
    helpers, stubs = _preamble(preamble)
    bound = _stored(module) | (helpers - set(stubs))
    free = _loaded(module) - bound - _BUILTINS - {"__name__", "__file__"}
    # A module is never called: a module's name called in the tests (`copy(xs)`) is the completion's function.
    modules = sorted(free & _MODULES - set(layout.entries) - _called(module))
    imported = sorted((name, _IMPORTED[name]) for name in free & set(_IMPORTED) - set(layout.entries))
    names = sorted(free - set(modules) - {name for name, _ in imported} | set(layout.entries))
    completion = set(names) | ({check.args.args[0].arg} if check else set())
    _refuse_untestable(layout.statements, completion)
    segments = [(source, is_test) for source, is_test, node in layout.segments if not _self_check(node, completion)]
    total = sum(is_test for _, is_test in segments)
    if not total:
        raise SandboxError(
            "the tests have no assert to run: give assert lines, or check(candidate) with entry_point "
            "(or a call check(<function>) in the tests)"
        )
    return Plan(tuple(segments), total, tuple(names), tuple(modules), preamble, tuple(stubs), tuple(imported))


class _Layout:
    """The tests' statements in the order the judge runs them, with check()'s body spliced in where it is called."""

    def __init__(self, check: ast.FunctionDef | None) -> None:
        self.check = check
        self.segments: list[tuple[str, bool, ast.stmt | None]] = []  # (source, is it a test?, its statement)
        self.statements: list[ast.stmt] = []  # the statements the segments hold, for the taint check
        self.entries: list[str] = []  # the functions check() is called with

    def add(self, node: ast.stmt, checks: list[ast.FunctionDef]) -> None:
        if any(node is c for c in checks):  # check's body runs where it is called; a later check replaces it
            if node is self.check and not _splittable(self.check):
                self.segments.append((_segment(node), False, None))
            return
        called = _check_call(node) if self.check is not None else None
        if called is not None:
            self.add_check(called)
        else:
            self.segments.append((_segment(node), _asserts(node), node))
            self.statements.append(node)

    def add_check(self, entry: str) -> None:
        self.entries.append(entry)
        if _splittable(self.check):
            self.segments.append((f"{self.check.args.args[0].arg} = {entry}", False, None))
            for node in self.check.body:
                self.segments.append((_segment(node), _asserts(node), node))
                self.statements.append(node)
        else:  # one test: the whole check, called
            self.segments.append((f"check({entry})", True, None))


def _parse(source: str, what: str) -> ast.Module:
    try:
        return ast.parse(source)
    except SyntaxError as e:
        raise SandboxError(f"{what} do not parse: {e.msg} (line {e.lineno})") from None
    except (ValueError, MemoryError, RecursionError) as e:
        raise SandboxError(f"{what} do not parse: {e}") from None


def _preamble(preamble: str | None) -> tuple[set[str], list[str]]:
    """The names the problem's preamble defines, and those of its functions that are stubs (a docstring or
    ``pass`` only): the completion's to define. A preamble that ends in a bare ``def`` line counts it as a stub."""
    if not preamble:
        return set(), []
    try:
        module = ast.parse(preamble)
    except SyntaxError:
        module = _parse(preamble.rstrip() + "\n    pass\n", "the problem's preamble does not parse; its stub and tests")
    stubs = [n.name for n in module.body if isinstance(n, ast.FunctionDef) and _is_stub(n)]
    return set().union(*(_stored(n) for n in module.body)), stubs


def _is_stub(function: ast.FunctionDef) -> bool:
    def empty(node: ast.stmt) -> bool:
        return isinstance(node, ast.Pass) or (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))

    return all(map(empty, function.body))


def _check_call(node: ast.stmt) -> str | None:
    """``X`` when `node` is the statement ``check(X)``."""
    if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)):
        return None
    call = node.value
    if isinstance(call.func, ast.Name) and call.func.id == "check" and not call.keywords and len(call.args) == 1:
        arg = call.args[0]
        return arg.id if isinstance(arg, ast.Name) else None
    return None


def _splittable(check: ast.FunctionDef) -> bool:
    """Whether ``check``'s body can run statement by statement at the top level, and asserts something."""
    inside = [n for statement in check.body for n in _outside_functions(statement)]
    if any(isinstance(n, ast.Return | ast.Nonlocal | ast.Yield | ast.YieldFrom | ast.Await) for n in inside):
        return False
    return any(map(_asserts, check.body))


def _segment(node: ast.stmt) -> str:
    """One statement on its own line as in the file, so that tracebacks name the right line."""
    return "\n" * (node.lineno - 1) + ast.unparse(node)


def _asserts(node: ast.stmt) -> bool:
    """Whether a statement is (or holds, in a loop, a branch or a ``try``) an assert of its own: then it is a test.
    HumanEval's ``assert True, "..."`` lines test nothing (any code passes them) and make no statement a test;
    ``assert False`` (after a call that should have raised) does."""
    return any(isinstance(n, ast.Assert) and not _always_true(n.test) for n in _outside_functions(node))


def _always_true(test: ast.expr) -> bool:
    return isinstance(test, ast.Constant) and bool(test.value)


def _outside_functions(node: ast.AST) -> Iterable[ast.AST]:
    """The nodes of a statement, not looking into the functions and classes it defines."""
    yield node
    for child in ast.iter_child_nodes(node):
        if not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            yield from _outside_functions(child)


def _called(node: ast.AST) -> set[str]:
    return {n.func.id for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}


def _loaded(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _stored(node: ast.AST) -> set[str]:
    """Every name `node` binds, at any depth: targets, definitions, imports, parameters, handlers, captures."""
    names = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store | ast.Del):
            names.add(n.id)
        elif isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(n.name)
        elif isinstance(n, ast.alias):
            names.add((n.asname or n.name).split(".")[0])
        elif isinstance(n, ast.arg):
            names.add(n.arg)
        elif isinstance(n, ast.ExceptHandler | ast.MatchAs | ast.MatchStar) and n.name:
            names.add(n.name)
        elif isinstance(n, ast.MatchMapping) and n.rest:
            names.add(n.rest)
        elif isinstance(n, ast.Global | ast.Nonlocal):
            names.update(n.names)
    return names


def _self_check(node: ast.stmt | None, completion: set[str]) -> bool:
    """An assert that the same expression equals itself, up to the completion's names (HumanEval/33:
    `tuple(candidate(x)) == tuple(sort_third(x))`, its own entry point twice): any consistent answer passes it, so it
    is no test and is left out. `f(10) > f(9)` or `f(5) == f(4) + f(3)` compare different things, and stay."""
    if not isinstance(node, ast.Assert) or not isinstance(node.test, ast.Compare) or len(node.test.ops) != 1:
        return False
    if not isinstance(node.test.ops[0], ast.Eq | ast.Is):
        return False
    left, right = node.test.left, node.test.comparators[0]
    return bool(_loaded(left) & completion) and _shape(left, completion) == _shape(right, completion)


def _shape(node: ast.expr, completion: set[str]) -> str:
    """The expression with every completion name as one placeholder."""

    class Rename(ast.NodeTransformer):
        def visit_Name(self, name: ast.Name) -> ast.Name:
            return ast.Name("_completion_" if name.id in completion else name.id, name.ctx)

    return ast.dump(Rename().visit(copy.deepcopy(node)), annotate_fields=False, include_attributes=False)


def _refuse_untestable(statements: list[ast.stmt], completion: set[str]) -> None:
    """Refuse an assert that is always true (a tuple: `assert (f(2) == 4, "msg")`), and a test that uses nothing of
    the completion's, directly or through a name the tests computed from it or handed to it (a flow-insensitive
    taint: a statement that reads a tainted name taints every name it binds or reads, since what it hands the
    completion may come back changed in place)."""
    for node in statements:
        for n in _outside_functions(node):
            if isinstance(n, ast.Assert) and isinstance(n.test, ast.Tuple) and n.test.elts:
                raise SandboxError(
                    f"the tests' assert on line {n.lineno} tests a tuple, which is always true: "
                    f"`{_short(n)}` (did you mean `assert <test>, <message>`?)"
                )
    tainted, changed = set(completion), True
    while changed:
        changed = False
        for node in statements:
            touched = _stored(node) | _loaded(node)
            if _loaded(node) & tainted and not touched <= tainted:
                tainted |= touched
                changed = True
    for node in statements:
        if _asserts(node) and not _loaded(node) & tainted:
            raise SandboxError(
                f"the test on line {node.lineno} uses nothing of the completion's (`{_short(node)}`): it would pass "
                "or fail whatever the answer; make it call the function under test (a function named like a builtin, "
                "such as `pow`, is the builtin here: give the problem an entry_point and check(candidate))"
            )


def _short(node: ast.stmt) -> str:
    text = " ".join(ast.unparse(node).split())
    return text if len(text) <= 60 else text[:57] + "..."
