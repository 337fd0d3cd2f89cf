"""Facts the plan depends on, read from Python source with `ast` rather than regexes.

Only changed files are parsed: a fact in an unchanged file is the same on both sides. Facts are
merged per side over all changed files, so a definition that moved between files is no change.
"""

import ast
from dataclasses import dataclass, field

from forkaudit._rules import SemanticRules


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
        """Parse one file and merge its facts; a file that does not parse is only recorded."""
        try:
            module = ast.parse(source, filename=path)
        except (SyntaxError, ValueError):
            self.parse_errors.append(path)
            return
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
class SemanticDiff:
    """What changed between the upstream's and the fork's facts, and a note per file."""

    env_vars: dict[str, object]
    semantic: dict[str, object]
    notes_by_path: dict[str, list[str]]


def compare_facts(upstream: PythonFacts, fork: PythonFacts) -> SemanticDiff:
    """Compare the facts of both sides; notes say, per file, what a reader should know."""
    notes: dict[str, list[str]] = {}

    def note(path: str, text: str) -> None:
        notes.setdefault(path, []).append(text)

    added_vars = sorted(fork.env_vars.keys() - upstream.env_vars.keys())
    removed_vars = sorted(upstream.env_vars.keys() - fork.env_vars.keys())
    default_changed = []
    for name in sorted(fork.env_vars.keys() & upstream.env_vars.keys()):
        (old, _), (new, path) = upstream.env_vars[name], fork.env_vars[name]
        if old != new:
            default_changed.append({"name": name, "old": old, "new": new})
            note(path, f"default of {name} {old} -> {new}")
    for name in added_vars:
        note(fork.env_vars[name][1], f"adds env var {name}")
    for name in removed_vars:
        note(upstream.env_vars[name][1], f"removes env var {name}")

    added_dtypes = sorted(fork.cache_dtypes.keys() - upstream.cache_dtypes.keys())
    removed_dtypes = sorted(upstream.cache_dtypes.keys() - fork.cache_dtypes.keys())
    for value in added_dtypes:
        note(fork.cache_dtypes[value], f"adds KV-cache dtype {value!r}")
    for value in removed_dtypes:
        note(upstream.cache_dtypes[value], f"removes KV-cache dtype {value!r}")

    added_backends = sorted(fork.backends.keys() - upstream.backends.keys())
    removed_backends = sorted(upstream.backends.keys() - fork.backends.keys())
    changed_backends = [
        {"name": name, "old": upstream.backends[name][0], "new": fork.backends[name][0]}
        for name in sorted(fork.backends.keys() & upstream.backends.keys())
        if upstream.backends[name][0] != fork.backends[name][0]
    ]
    for name in added_backends:
        note(fork.backends[name][1], f"adds attention backend {name}")
    for name in removed_backends:
        note(upstream.backends[name][1], f"removes attention backend {name}")
    for change in changed_backends:
        note(fork.backends[str(change["name"])][1], f"re-registers backend {change['name']}")

    kv_dtype_changes = []
    for backend in sorted(fork.backend_kv_dtypes.keys() | upstream.backend_kv_dtypes.keys()):
        old_dtypes, old_path = upstream.backend_kv_dtypes.get(backend, (frozenset(), ""))
        new_dtypes, new_path = fork.backend_kv_dtypes.get(backend, (frozenset(), ""))
        if old_dtypes == new_dtypes:
            continue
        added, removed = sorted(new_dtypes - old_dtypes), sorted(old_dtypes - new_dtypes)
        kv_dtype_changes.append({"backend": backend, "added": added, "removed": removed})
        note(new_path or old_path, f"{backend} KV-cache dtypes +{added} -{removed}")

    return SemanticDiff(
        env_vars={"added": added_vars, "removed": removed_vars, "default_changed": default_changed},
        semantic={
            "cache_dtypes": {"added": added_dtypes, "removed": removed_dtypes},
            "attention_backends": {
                "added": added_backends,
                "removed": removed_backends,
                "changed": changed_backends,
            },
            "backend_kv_cache_dtypes": kv_dtype_changes,
            "parse_errors": sorted({*upstream.parse_errors, *fork.parse_errors}),
        },
        notes_by_path=notes,
    )


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
