"""Where a Python symbol is defined in a tree of source files, found with `ast`, never imported.

A symbol is named as a plugin imports it: a module and a dotted name in it
(`vllm.config:ModelConfig`, `vllm.platforms.rocm:RocmPlatform.get_attn_backend_cls`). The module's
top-level bindings are read as Python runs them: the last binding of a name wins, blocks under
`if TYPE_CHECKING:` bind nothing, `from X import name` (absolute or relative) and star imports
are followed into X, and a name looked up on a class is searched in the class body, then in its
bases that the tree defines. So a definition that moved to another module and is re-exported is
found where it now lives.
"""

import ast
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal, get_args

#: What a definition is, as a declared hook names it: a class, a plain function or method, a
#: classmethod, a staticmethod, a property (or cached property), or a value (an assignment).
SymbolKind = str
SYMBOL_KINDS = ("class", "function", "classmethod", "staticmethod", "property", "value")

# Imports followed (and bases searched) at most this deep: deeper means a cycle or hostile input.
_MAX_DEPTH = 16


#: Why a lookup fails: the module's file is absent, the module binds no such name, the class
#: (nor any base the tree defines) has no such member, or the file does not parse (or is over
#: the size a file is parsed at).
LookupProblem = Literal["module-missing", "name-missing", "member-missing", "unparsable"]
LOOKUP_PROBLEMS: tuple[LookupProblem, ...] = get_args(LookupProblem)


class SymbolNotFound(Exception):  # noqa: N818 (a lookup's outcome, caught where it is looked up)
    """A symbol could not be found: PROBLEM says why, DETAIL names what."""

    def __init__(self, problem: LookupProblem, detail: str) -> None:
        super().__init__(problem, detail)
        self.problem = problem
        self.detail = detail


@dataclass(frozen=True)
class Definition:
    """One definition: the file (from the tree root) and first line (its first decorator's),
    what kind it is, its source lines and the `ast` dump that two definitions are compared by
    (so layout and comments are no change)."""

    path: str
    line: int
    kind: SymbolKind
    text: str
    dump: str
    node: ast.stmt
    module: str


@dataclass(frozen=True)
class _ModuleRef:
    """A name bound to a module (`import a.b as c`, or a submodule imported from its package)."""

    name: str


@dataclass
class _Module:
    name: str
    path: str
    is_package: bool
    tree: ast.Module
    lines: list[str]


class SourceTree:
    """The Python modules of one side, read through READ (a path from the tree root -> its
    bytes, or None when the side has no such regular file). Each file is parsed once."""

    def __init__(self, read: Callable[[str], bytes | None]) -> None:
        self._read = read
        self._modules: dict[str, _Module | None] = {}
        self._unparsable: dict[str, str] = {}

    def find(self, module: str, qualname: str) -> Definition:
        """The definition of QUALNAME in MODULE; raises `SymbolNotFound`."""
        head, *rest = qualname.split(".")
        found = self._binding(module, head, 0)
        for part in rest:
            found = self._member(found, part, 0)
        if isinstance(found, _ModuleRef):
            raise SymbolNotFound("name-missing", f"{module}:{qualname} (a module)")
        return found

    def member(self, owner: Definition, name: str) -> Definition:
        """The definition of NAME on the class OWNER (its body, then its bases)."""
        found = self._member(owner, name, 0)
        if isinstance(found, _ModuleRef):
            raise SymbolNotFound("member-missing", name)
        return found

    # -- modules

    def _module(self, name: str) -> _Module:
        if name in self._unparsable:
            raise SymbolNotFound("unparsable", self._unparsable[name])
        if name not in self._modules:
            self._modules[name] = self._load(name)
        module = self._modules[name]
        if module is None:
            raise SymbolNotFound("module-missing", name)
        return module

    def _load(self, name: str) -> _Module | None:
        base = name.replace(".", "/")
        for path, is_package in ((f"{base}.py", False), (f"{base}/__init__.py", True)):
            source = self._read(path)
            if source is None:
                continue
            try:
                tree = ast.parse(source, filename=path)
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                # A fork's file is hostile input: too deep for the parser is unparsable.
                self._unparsable[name] = path
                raise SymbolNotFound("unparsable", path) from None
            text = source.decode("utf-8", "replace")
            return _Module(name, path, is_package, tree, text.splitlines())
        return None

    def _has_module(self, name: str) -> bool:
        try:
            self._module(name)
        except SymbolNotFound as missing:
            return missing.problem == "unparsable"
        return True

    # -- names

    def _binding(self, module_name: str, name: str, depth: int) -> Definition | _ModuleRef:
        """What NAME is bound to at the top level of MODULE_NAME, imports followed."""
        if depth > _MAX_DEPTH:
            raise SymbolNotFound("name-missing", f"{module_name}:{name} (imports nest too deep)")
        module = self._module(module_name)
        bound: ast.stmt | None = None
        stars: list[ast.ImportFrom] = []
        for statement in _runtime_statements(module.tree.body):
            if _binds(statement, name, in_class=False):
                bound = statement
            elif isinstance(statement, ast.ImportFrom) and any(
                alias.name == "*" for alias in statement.names
            ):
                stars.append(statement)
        if bound is None:
            for star in reversed(stars):
                try:
                    return self._binding(_absolute(module, star), name, depth + 1)
                except SymbolNotFound:
                    continue
            raise SymbolNotFound("name-missing", f"{module_name}:{name}")
        if isinstance(bound, ast.Import):
            return _ModuleRef(_imported_module(bound, name))
        if isinstance(bound, ast.ImportFrom):
            source = _absolute(module, bound)
            original = next(
                alias.name for alias in bound.names if (alias.asname or alias.name) == name
            )
            try:
                return self._binding(source, original, depth + 1)
            except SymbolNotFound as missing:
                # `from package import submodule` binds the submodule.
                if missing.problem == "name-missing" and self._has_module(f"{source}.{original}"):
                    return _ModuleRef(f"{source}.{original}")
                raise
        return _definition(module, bound, in_class=False)

    def _member(
        self, owner: Definition | _ModuleRef, name: str, depth: int
    ) -> Definition | _ModuleRef:
        if isinstance(owner, _ModuleRef):
            return self._binding(owner.name, name, depth + 1)
        if not isinstance(owner.node, ast.ClassDef) or depth > _MAX_DEPTH:
            raise SymbolNotFound("member-missing", name)
        module = self._module(owner.module)
        bound = None
        for statement in _runtime_statements(owner.node.body):
            if _binds(statement, name, in_class=True):
                bound = statement
        if bound is not None:
            return _definition(module, bound, in_class=True)
        for base in owner.node.bases:
            try:
                found = self._base(owner.module, base, depth)
                return self._member(found, name, depth + 1)
            except SymbolNotFound:
                continue
        raise SymbolNotFound("member-missing", name)

    def _base(self, module_name: str, base: ast.expr, depth: int) -> Definition:
        """The class a base expression (`Name`, `a.Name`, `Name[T]`) names, if the tree has it."""
        if isinstance(base, ast.Subscript):  # Generic[M], AttentionImplBase[T]
            base = base.value
        parts: list[str] = []
        while isinstance(base, ast.Attribute):
            parts.insert(0, base.attr)
            base = base.value
        if not isinstance(base, ast.Name):
            raise SymbolNotFound("member-missing", ast.unparse(base))
        found = self._binding(module_name, base.id, depth + 1)
        for part in parts:
            found = self._member(found, part, depth + 1)
        if isinstance(found, _ModuleRef):
            raise SymbolNotFound("member-missing", base.id)
        return found


def _runtime_statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """BODY's statements in source order, with those of `if`/`try` blocks, except the ones only
    a type checker runs (`if TYPE_CHECKING:`)."""
    for statement in body:
        if isinstance(statement, ast.If):
            if not _is_type_checking(statement.test):
                yield from _runtime_statements(statement.body)
            yield from _runtime_statements(statement.orelse)
        elif isinstance(statement, ast.Try | ast.TryStar):
            yield from _runtime_statements(statement.body)
            for handler in statement.handlers:
                yield from _runtime_statements(handler.body)
            yield from _runtime_statements(statement.orelse)
            yield from _runtime_statements(statement.finalbody)
        else:
            yield statement


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _binds(statement: ast.stmt, name: str, *, in_class: bool) -> bool:
    """Whether STATEMENT binds NAME. In a class body an annotation alone declares a field (a
    dataclass's or a NamedTuple's); at module level it binds nothing."""
    if isinstance(statement, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
        return statement.name == name
    if isinstance(statement, ast.Assign):
        return any(isinstance(t, ast.Name) and t.id == name for t in statement.targets)
    if isinstance(statement, ast.AnnAssign):
        target = statement.target
        declared = in_class or statement.value is not None
        return declared and isinstance(target, ast.Name) and target.id == name
    if isinstance(statement, ast.Import | ast.ImportFrom) and not in_class:
        return any(_alias_binds(alias, name) for alias in statement.names)
    return False


def _alias_binds(alias: ast.alias, name: str) -> bool:
    if alias.name == "*":
        return False
    return (alias.asname or alias.name.split(".")[0]) == name


def _imported_module(statement: ast.Import, name: str) -> str:
    """The module `import a.b [as name]` binds NAME to: `a.b` with `as`, else `a`."""
    for alias in statement.names:
        if alias.asname == name:
            return alias.name
    return name


def _absolute(module: _Module, statement: ast.ImportFrom) -> str:
    """The absolute name of the module a `from ... import` reads, relative levels resolved."""
    if not statement.level:
        return statement.module or ""
    package = module.name.split(".")
    if not module.is_package:
        package = package[:-1]
    if statement.level > 1:
        package = package[: len(package) - (statement.level - 1)]
    return ".".join([*package, *([statement.module] if statement.module else [])])


def _definition(module: _Module, node: ast.stmt, *, in_class: bool) -> Definition:
    decorators = getattr(node, "decorator_list", [])
    first = min([node.lineno, *(d.lineno for d in decorators)])
    last = node.end_lineno or node.lineno
    return Definition(
        path=module.path,
        line=first,
        kind=_kind(node, in_class=in_class),
        text="\n".join(module.lines[first - 1 : last]),
        dump=ast.dump(node),
        node=node,
        module=module.name,
    )


def _kind(node: ast.stmt, *, in_class: bool) -> SymbolKind:
    if isinstance(node, ast.ClassDef):
        return "class"
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        names = {_decorator_name(d) for d in node.decorator_list}
        if in_class and "classmethod" in names:
            return "classmethod"
        if in_class and "staticmethod" in names:
            return "staticmethod"
        if in_class and names & {"property", "cached_property"}:
            return "property"
        return "function"
    return "value"


def _decorator_name(decorator: ast.expr) -> str:
    if isinstance(decorator, ast.Call):
        decorator = decorator.func
    if isinstance(decorator, ast.Attribute):
        return decorator.attr
    return decorator.id if isinstance(decorator, ast.Name) else ""


def parameters(definition: Definition) -> list[str] | None:
    """A function's parameter names in order (`self`/`cls` included, `*args` and `**kwargs` by
    their names), as `inspect.signature` lists them; None for anything else."""
    node = definition.node
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return None
    arguments = node.args
    return [
        argument.arg
        for argument in (
            *arguments.posonlyargs,
            *arguments.args,
            *([arguments.vararg] if arguments.vararg else []),
            *arguments.kwonlyargs,
            *([arguments.kwarg] if arguments.kwarg else []),
        )
    ]


def string_values(definition: Definition) -> set[str] | None:
    """The strings a value names: a `Literal[...]`'s, a dict's keys, a list's, tuple's or set's
    elements; None when the definition assigns none of those."""
    node = definition.node
    value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
    if isinstance(value, ast.Subscript):
        value = value.slice
    if isinstance(value, ast.Dict):
        items: list[ast.expr | None] = list(value.keys)
    elif isinstance(value, ast.Tuple | ast.List | ast.Set):
        items = list(value.elts)
    elif isinstance(value, ast.Constant):
        items = [value]
    else:
        return None
    return {
        item.value
        for item in items
        if isinstance(item, ast.Constant) and isinstance(item.value, str)
    }


def read_version(tree: SourceTree, package: str) -> str | None:
    """The `__version__` string PACKAGE's generated `_version.py` assigns, if it has one."""
    try:
        found = tree.find(f"{package}._version", "__version__")
    except SymbolNotFound:
        return None
    values = string_values(found)
    return next(iter(values)) if values and len(values) == 1 else None
