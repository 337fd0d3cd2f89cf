"""Facts the plan depends on, read from Python source with `ast` rather than regexes.

Only changed files are parsed: a fact in an unchanged file is the same on both sides. Facts are
merged per side over all changed files, so a definition that moved between files is no change.
"""

import ast
from dataclasses import dataclass, field
from typing import Literal, get_args

from forkaudit._rules import SemanticRules

#: A Python file over this many bytes is not parsed ("not parsed: too large"): parsing holds some
#: hundred times a file's size (a 16 MiB file took 1.9 GB and 26 s); vLLM's largest is 295 KB.
MAX_PARSED_BYTES = 1 << 20

FactSubject = Literal["env_var", "cache_dtype", "attention_backend", "backend_kv_cache_dtype"]
FACT_SUBJECTS: tuple[FactSubject, ...] = get_args(FactSubject)
FactChange = Literal["added", "removed", "changed"]
FACT_CHANGES: tuple[FactChange, ...] = get_args(FactChange)


@dataclass
class PythonFacts:
    """Facts from one side's changed Python files; each value records the file it came from."""

    #: env var name -> (default as source text, or None when none is written, file)
    env_vars: dict[str, tuple[str | None, str]] = field(default_factory=dict)
    #: cache dtype name -> file
    cache_dtypes: dict[str, str] = field(default_factory=dict)
    #: "Enum.MEMBER" -> (value as source text, file)
    backends: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: backend class -> (its supported KV-cache dtypes, file)
    backend_kv_dtypes: dict[str, tuple[frozenset[str], str]] = field(default_factory=dict)
    parse_errors: list[str] = field(default_factory=list)

    def add_source(self, path: str, source: bytes, rules: SemanticRules) -> None:
        """Parse one file and merge its facts; a file that does not parse is only recorded.

        A fork's file is hostile input: nesting too deep for the parser (or for `ast.unparse`)
        makes it unparsed, not a crash. Its facts are merged only once all were read.
        """
        facts = PythonFacts()
        try:
            module = ast.parse(source, filename=path)
            facts.read_module(module, path, rules)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            self.parse_errors.append(path)
            return
        self.env_vars.update(facts.env_vars)
        self.cache_dtypes.update(facts.cache_dtypes)
        self.backends.update(facts.backends)
        self.backend_kv_dtypes.update(facts.backend_kv_dtypes)

    def read_module(self, module: ast.Module, path: str, rules: SemanticRules) -> None:
        if path in rules.envs_files:
            for name, default in _env_vars(module, rules.env_dicts).items():
                self.env_vars[name] = (default, path)
        for statement in module.body:
            if _assigned_name(statement) in rules.cache_dtype_names:
                for value in _string_values(_assigned_value(statement)):
                    self.cache_dtypes[value] = path
            if isinstance(statement, ast.ClassDef):
                self._add_class(statement, path, rules)

    def _add_class(self, cls: ast.ClassDef, path: str, rules: SemanticRules) -> None:
        for statement in cls.body:
            name, value = _assigned_name(statement), _assigned_value(statement)
            if name is None or value is None:
                continue
            if cls.name in rules.backend_enums and not name.startswith("_"):
                self.backends[f"{cls.name}.{name}"] = (ast.unparse(value), path)
            if name in rules.kv_cache_dtype_attributes:
                self.backend_kv_dtypes[cls.name] = (frozenset(_string_values(value)), path)


@dataclass(frozen=True)
class Fact:
    """One difference between the upstream's and the fork's facts, and the file that shows it
    (the fork's; the upstream's for a removal).

    NAME is the env var, the KV-cache dtype, the `Enum.MEMBER` of a backend, or the backend
    class whose supported KV-cache dtypes changed. OLD and NEW are the values on each side: an
    env var's default, a backend's registered target, the dtype a backend gained (NEW) or lost
    (OLD); None where a side has none.
    """

    subject: FactSubject
    change: FactChange
    name: str
    path: str
    old: str | None = None
    new: str | None = None

    def to_dict(self) -> dict[str, object]:
        return {
            "subject": self.subject,
            "change": self.change,
            "name": self.name,
            "path": self.path,
            "old": self.old,
            "new": self.new,
        }

    def note(self) -> str:
        """The fact in words, for the file it is found in."""
        if self.subject == "env_var":
            return {
                "added": f"adds env var {self.name}",
                "removed": f"removes env var {self.name}",
                "changed": f"default of {self.name} {self.old} -> {self.new}",
            }[self.change]
        if self.subject == "cache_dtype":
            verb = "adds" if self.change == "added" else "removes"
            return f"{verb} KV-cache dtype {self.name!r}"
        if self.subject == "attention_backend":
            return {
                "added": f"adds attention backend {self.name}",
                "removed": f"removes attention backend {self.name}",
                "changed": f"re-registers backend {self.name}",
            }[self.change]
        dtype = self.new if self.change == "added" else self.old
        sign = "+" if self.change == "added" else "-"
        return f"{self.name} KV-cache dtypes {sign}{dtype!r}"


@dataclass(frozen=True)
class SemanticDiff:
    """What changed between the upstream's and the fork's facts."""

    facts: list[Fact]
    parse_errors: list[str]
    #: Changed Python files over `MAX_PARSED_BYTES`, not parsed.
    too_large: list[str] = field(default_factory=list)

    def notes_by_path(self) -> dict[str, list[str]]:
        """Per file, what a reader should know about it."""
        notes: dict[str, list[str]] = {}
        for fact in self.facts:
            notes.setdefault(fact.path, []).append(fact.note())
        return notes

    def env_vars(self) -> dict[str, object]:
        """The JSON document's `env_vars`."""
        facts = [f for f in self.facts if f.subject == "env_var"]
        return {
            "added": [f.name for f in facts if f.change == "added"],
            "removed": [f.name for f in facts if f.change == "removed"],
            "default_changed": [
                {"name": f.name, "old": f.old, "new": f.new} for f in facts if f.change == "changed"
            ],
        }

    def semantic(self) -> dict[str, object]:
        """The JSON document's `semantic`."""

        def names(subject: FactSubject, change: FactChange) -> list[str]:
            return [f.name for f in self.facts if f.subject == subject and f.change == change]

        per_backend: dict[str, dict[str, list[str]]] = {}
        for fact in self.facts:
            if fact.subject == "backend_kv_cache_dtype":
                dtypes = per_backend.setdefault(fact.name, {"added": [], "removed": []})
                dtypes[fact.change].append(str(fact.new if fact.change == "added" else fact.old))
        return {
            "cache_dtypes": {
                "added": names("cache_dtype", "added"),
                "removed": names("cache_dtype", "removed"),
            },
            "attention_backends": {
                "added": names("attention_backend", "added"),
                "removed": names("attention_backend", "removed"),
                "changed": [
                    {"name": f.name, "old": f.old, "new": f.new}
                    for f in self.facts
                    if f.subject == "attention_backend" and f.change == "changed"
                ],
            },
            "backend_kv_cache_dtypes": [
                {"backend": backend, **dtypes} for backend, dtypes in per_backend.items()
            ],
            "parse_errors": self.parse_errors,
        }


def compare_facts(upstream: PythonFacts, fork: PythonFacts) -> SemanticDiff:
    """Compare the facts of both sides, each difference with the file that shows it."""
    facts: list[Fact] = []
    for name in sorted(fork.env_vars.keys() - upstream.env_vars.keys()):
        default, path = fork.env_vars[name]
        facts.append(Fact("env_var", "added", name, path, new=default))
    for name in sorted(upstream.env_vars.keys() - fork.env_vars.keys()):
        default, path = upstream.env_vars[name]
        facts.append(Fact("env_var", "removed", name, path, old=default))
    for name in sorted(fork.env_vars.keys() & upstream.env_vars.keys()):
        (old, _), (new, path) = upstream.env_vars[name], fork.env_vars[name]
        if old != new:
            facts.append(Fact("env_var", "changed", name, path, old=old, new=new))

    for value in sorted(fork.cache_dtypes.keys() - upstream.cache_dtypes.keys()):
        facts.append(Fact("cache_dtype", "added", value, fork.cache_dtypes[value]))
    for value in sorted(upstream.cache_dtypes.keys() - fork.cache_dtypes.keys()):
        facts.append(Fact("cache_dtype", "removed", value, upstream.cache_dtypes[value]))

    for name in sorted(fork.backends.keys() - upstream.backends.keys()):
        target, path = fork.backends[name]
        facts.append(Fact("attention_backend", "added", name, path, new=target))
    for name in sorted(upstream.backends.keys() - fork.backends.keys()):
        target, path = upstream.backends[name]
        facts.append(Fact("attention_backend", "removed", name, path, old=target))
    for name in sorted(fork.backends.keys() & upstream.backends.keys()):
        (old, _), (new, path) = upstream.backends[name], fork.backends[name]
        if old != new:
            facts.append(Fact("attention_backend", "changed", name, path, old=old, new=new))

    for backend in sorted(fork.backend_kv_dtypes.keys() | upstream.backend_kv_dtypes.keys()):
        old_dtypes, old_path = upstream.backend_kv_dtypes.get(backend, (frozenset(), ""))
        new_dtypes, new_path = fork.backend_kv_dtypes.get(backend, (frozenset(), ""))
        path = new_path or old_path
        facts += [
            Fact("backend_kv_cache_dtype", "added", backend, path, new=dtype)
            for dtype in sorted(new_dtypes - old_dtypes)
        ]
        facts += [
            Fact("backend_kv_cache_dtype", "removed", backend, path, old=dtype)
            for dtype in sorted(old_dtypes - new_dtypes)
        ]
    return SemanticDiff(facts, sorted({*upstream.parse_errors, *fork.parse_errors}))


def _assigned_name(statement: ast.stmt) -> str | None:
    """The single plain name an assignment binds (`X = ...` or `X: T = ...`), else None."""
    if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
        return statement.target.id
    if (
        isinstance(statement, ast.Assign)
        and len(statement.targets) == 1
        and isinstance(statement.targets[0], ast.Name)
    ):
        return statement.targets[0].id
    return None


def _assigned_value(statement: ast.stmt) -> ast.expr | None:
    if isinstance(statement, ast.Assign | ast.AnnAssign):
        return statement.value
    return None


def _string_values(node: ast.expr | None) -> list[str]:
    """The strings a Literal[...], list, tuple, set or dict's keys spell out."""
    if isinstance(node, ast.Subscript):  # Literal["a", "b"]
        return _string_values(node.slice)
    if isinstance(node, ast.Dict):
        return [
            k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)
        ]
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        return [s for element in node.elts for s in _string_values(element)]
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    return []


def _env_vars(module: ast.Module, dict_names: tuple[str, ...]) -> dict[str, str | None]:
    """Env vars and their defaults from an envs module.

    The variables are the string keys of the module-level dict named in DICT_NAMES. A default is
    the second argument (or `default=`) of the first call in the entry that passes the variable's
    own name first, as `os.getenv("X", "1")` or a helper `env_with_choices("X", "1", ...)` do.
    Failing that, the value declared under `if TYPE_CHECKING:` counts. Without a dict, the names
    declared under TYPE_CHECKING are the variables.
    """
    declared = _type_checking_declarations(module)
    registry = next(
        (
            _assigned_value(s)
            for s in module.body
            if _assigned_name(s) in dict_names and isinstance(_assigned_value(s), ast.Dict)
        ),
        None,
    )
    if not isinstance(registry, ast.Dict):
        return declared
    env_vars: dict[str, str | None] = {}
    for key, value in zip(registry.keys, registry.values, strict=True):
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            env_vars[key.value] = _default_in_call(value, key.value) or declared.get(key.value)
    return env_vars


def _default_in_call(node: ast.expr, name: str) -> str | None:
    for call in ast.walk(node):
        if not isinstance(call, ast.Call) or not call.args:
            continue
        first = call.args[0]
        if not (isinstance(first, ast.Constant) and first.value == name):
            continue
        if len(call.args) > 1:
            return ast.unparse(call.args[1])
        keyword = next((k for k in call.keywords if k.arg == "default"), None)
        return ast.unparse(keyword.value) if keyword else None
    return None


def _type_checking_declarations(module: ast.Module) -> dict[str, str | None]:
    declared: dict[str, str | None] = {}
    for statement in module.body:
        if isinstance(statement, ast.If) and ast.unparse(statement.test) == "TYPE_CHECKING":
            for inner in statement.body:
                name = _assigned_name(inner)
                if name:
                    value = _assigned_value(inner)
                    declared[name] = ast.unparse(value) if value is not None else None
    return declared
