"""Fetching an sdist or a wheel from the package index that pip is configured to use.

`pip download` cannot fetch vLLM's sdist: it prepares metadata, which builds, which needs torch.
So the file is found through the simple API (PEP 691 JSON or PEP 503 HTML) of every index in
pip's configuration (index-url, extra-index-url, find-links, no-index, cert, timeout), checked
against the index's sha256 and kept in a cache directory.
"""

import hashlib
import json
import os
import re
import ssl
import subprocess
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

from packaging.tags import sys_tags
from packaging.utils import (
    InvalidWheelFilename,
    canonicalize_name,
    canonicalize_version,
    parse_wheel_filename,
)

from forkaudit._errors import FetchError, SpecError

DEFAULT_INDEX_URL = "https://pypi.org/simple"
#: An index page over this size is not read (vLLM's page on PyPI, every release listed, is
#: well under 2 MB).
MAX_INDEX_PAGE_BYTES = 64 << 20
_ACCEPT = "application/vnd.pypi.simple.v1+json, text/html;q=0.1"
# pip reads `[global]`, then a command's section, then PIP_* variables, each overriding the last.
_SECTION_PRIORITY = {"global": 1, "download": 2, ":env:": 3}


@dataclass(frozen=True)
class _Link:
    filename: str
    url: str
    sha256: str | None


@dataclass
class PipIndexConfig:
    """The parts of pip's configuration that say where packages come from."""

    index_urls: list[str]
    find_links: list[str]
    cert: str | None = None
    timeout: float = 60.0
    unreachable: list[str] = field(default_factory=list)


def default_cache_dir() -> Path:
    """`$FORKAUDIT_CACHE`, else `$XDG_CACHE_HOME/forkaudit`, else `~/.cache/forkaudit`."""
    if explicit := os.environ.get("FORKAUDIT_CACHE"):
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "forkaudit"


def read_pip_config() -> PipIndexConfig:
    """Ask this interpreter's pip for its merged configuration (files and PIP_* variables)."""
    options: dict[str, tuple[int, str]] = {}
    completed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"],
        capture_output=True,
        text=True,
        check=False,
    )
    # Without pip in this environment only the PIP_* variables can say anything.
    lines = completed.stdout.splitlines() if completed.returncode == 0 else []
    if completed.returncode != 0:
        lines = [
            f":env:.{key[4:].lower().replace('_', '-')}='{value}'"
            for key, value in os.environ.items()
            if key.startswith("PIP_")
        ]
    for line in lines:
        dotted, _, quoted = line.partition("=")
        section, _, option = dotted.rpartition(".")
        priority = _SECTION_PRIORITY.get(section)
        if priority is None or priority < options.get(option, (0, ""))[0]:
            continue
        options[option] = (priority, quoted.strip().strip("'\""))
    values = {option: value for option, (_, value) in options.items()}
    no_index = values.get("no-index", "").lower() in {"1", "true", "yes", "on"}
    index_urls = (
        []
        if no_index
        else [
            values.get("index-url", DEFAULT_INDEX_URL),
            *values.get("extra-index-url", "").split(),
        ]
    )
    return PipIndexConfig(
        index_urls=index_urls,
        find_links=values.get("find-links", "").split(),
        cert=values.get("cert"),
        timeout=float(values.get("timeout") or values.get("default-timeout") or 60),
    )


# A project name as PEP 508 spells it.
_PROJECT_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?")
# The longest file name a file system takes.
_MAX_FILE_NAME_BYTES = 255


def is_plain_file_name(name: str) -> bool:
    """Whether NAME, a file name an index gives, names a file in the cache folder itself: no
    folder part, no leading dot, nothing a file system refuses (NUL, too long)."""
    return (
        bool(name)
        and not name.startswith(".")
        and not any(char in name for char in "/\\\0")
        and name.isprintable()
        and len(os.fsencode(name)) <= _MAX_FILE_NAME_BYTES
    )


def fetch_from_index(spec: str, requirement: str, kind: str, cache_dir: Path | None) -> Path:
    """Download the sdist or wheel (KIND) of NAME==VERSION, or reuse the cached copy."""
    name, separator, version = requirement.partition("==")
    if not separator or not name.strip() or not version.strip():
        msg = f"`{spec}`: expected NAME==VERSION after the prefix, got {requirement!r}"
        raise SpecError(msg)
    name, version = name.strip(), version.strip()
    if not _PROJECT_NAME.fullmatch(name):
        msg = f"`{spec}`: {name!r} is not a project name (letters, digits, '.', '_', '-')"
        raise SpecError(msg)
    cache = (cache_dir or default_cache_dir()) / canonicalize_name(name)
    cached = _pick(kind, name, version, [_Link(p.name, p.as_uri(), None) for p in _files(cache)])
    if cached is not None:
        return cache / cached.filename
    config = read_pip_config()
    links = _links_from_indexes(config, name)
    chosen = _pick(kind, name, version, links)
    if chosen is None:
        where = ", ".join([*config.index_urls, *config.find_links]) or "no index configured"
        unreachable = (
            f" (unreachable: {'; '.join(config.unreachable)})" if config.unreachable else ""
        )
        msg = f"`{spec}`: no {kind} of {name}=={version} found on {where}{unreachable}"
        raise FetchError(msg)
    return _download(spec, chosen, cache, config)


def _files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.is_file()) if directory.is_dir() else []


def _pick(kind: str, name: str, version: str, links: list[_Link]) -> _Link | None:
    """The sdist, or the wheel best suited to this interpreter, of NAME==VERSION among LINKS."""
    wanted_name, wanted_version = canonicalize_name(name), canonicalize_version(version)
    if kind == "sdist":
        for link in links:
            stem, dash, link_version = link.filename.removesuffix(".tar.gz").rpartition("-")
            if (
                link.filename.endswith(".tar.gz")
                and dash
                and canonicalize_name(stem) == wanted_name
                and canonicalize_version(link_version) == wanted_version
            ):
                return link
        return None
    tag_rank = {tag: rank for rank, tag in enumerate(sys_tags())}
    ranked: list[tuple[int, str, _Link]] = []
    for link in links:
        try:
            wheel_name, wheel_version, _build, tags = parse_wheel_filename(link.filename)
        except InvalidWheelFilename:
            continue
        if wheel_name != wanted_name or canonicalize_version(wheel_version) != wanted_version:
            continue
        # The audit reads files and never runs them, so a wheel for another platform still
        # serves when none fits this one; it ranks after every compatible wheel.
        rank = min((tag_rank.get(tag, len(tag_rank)) for tag in tags), default=len(tag_rank))
        ranked.append((rank, link.filename, link))
    return min(ranked)[2] if ranked else None


def _links_from_indexes(config: PipIndexConfig, name: str) -> list[_Link]:
    """The links of every configured index that name a plain file (`is_plain_file_name`): an
    index's file name becomes a path in the cache, so one with a folder part is not used."""
    links: list[_Link] = []
    for index_url in config.index_urls:
        page = index_url.rstrip("/") + "/" + canonicalize_name(name) + "/"
        links += _read_page(page, config)
    for location in config.find_links:
        links += _read_find_links(location, config)
    return [link for link in links if is_plain_file_name(link.filename)]


def _read_find_links(location: str, config: PipIndexConfig) -> list[_Link]:
    """find-links names a directory of files or a page of links to them."""
    parsed = urllib.parse.urlparse(location)
    directory = Path(urllib.request.url2pathname(parsed.path)) if parsed.scheme == "file" else None
    if not parsed.scheme or len(parsed.scheme) == 1:  # a plain (or Windows drive) path
        directory = Path(location)
    if directory is not None:
        return [_Link(p.name, p.as_uri(), None) for p in _files(directory)]
    return _read_page(location, config)


def _read_page(url: str, config: PipIndexConfig) -> list[_Link]:
    """The file links on one simple-API page; a missing page means the index lacks the project.

    A page that is too large or malformed counts as an index that could not answer.
    """
    if url.startswith("file:"):
        local = Path(urllib.request.url2pathname(urllib.parse.urlparse(url).path))
        if local.is_dir():
            local /= "index.html"
        if not local.is_file():
            return []
        with local.open("rb") as page:
            body = page.read(MAX_INDEX_PAGE_BYTES + 1)
        content_type, base = "text/html", local.as_uri()
    else:
        request = urllib.request.Request(url, headers={"Accept": _ACCEPT})  # noqa: S310 (index URLs come from pip's config)
        try:
            with urllib.request.urlopen(  # noqa: S310
                request, timeout=config.timeout, context=_ssl_context(config)
            ) as response:
                body = response.read(MAX_INDEX_PAGE_BYTES + 1)
                content_type = response.headers.get_content_type()
                base = response.geturl()
        except urllib.error.HTTPError as error:
            if error.code != 404:
                config.unreachable.append(f"{url}: HTTP {error.code}")
            return []
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            config.unreachable.append(f"{url}: {reason}")
            return []
    if len(body) > MAX_INDEX_PAGE_BYTES:
        config.unreachable.append(f"{url}: page larger than {MAX_INDEX_PAGE_BYTES} bytes")
        return []
    if content_type == "application/vnd.pypi.simple.v1+json":
        try:
            return [_link_from_json(file, base) for file in json.loads(body)["files"]]
        except (ValueError, RecursionError, KeyError, TypeError):
            config.unreachable.append(f"{url}: not a simple-API JSON page (PEP 691)")
            return []
    anchors = _AnchorParser()
    anchors.feed(body.decode("utf-8", "replace"))
    return [_link_from_href(urllib.parse.urljoin(base, href)) for href in anchors.hrefs]


def _link_from_json(file: object, base: str) -> _Link:
    """One entry of a PEP 691 page's `files`; TypeError for one of another shape."""
    if not isinstance(file, dict):
        raise TypeError(file)
    filename, url, hashes = file["filename"], file["url"], file.get("hashes", {})
    if not (isinstance(filename, str) and isinstance(url, str) and isinstance(hashes, dict)):
        raise TypeError(file)
    sha256 = hashes.get("sha256")
    return _Link(
        filename, urllib.parse.urljoin(base, url), sha256 if isinstance(sha256, str) else None
    )


def _link_from_href(url: str) -> _Link:
    without_fragment, _, fragment = url.partition("#")
    sha256 = fragment.removeprefix("sha256=") if fragment.startswith("sha256=") else None
    filename = urllib.parse.unquote(urllib.parse.urlparse(without_fragment).path.rsplit("/", 1)[-1])
    return _Link(filename, without_fragment, sha256)


class _AnchorParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        href = dict(attrs).get("href")
        if tag == "a" and href:
            self.hrefs.append(href)


def _ssl_context(config: PipIndexConfig) -> ssl.SSLContext:
    return (
        ssl.create_default_context(cafile=config.cert)
        if config.cert
        else ssl.create_default_context()
    )


def _download(spec: str, link: _Link, cache: Path, config: PipIndexConfig) -> Path:
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / link.filename
    digest = hashlib.sha256()
    with tempfile.NamedTemporaryFile(dir=cache, prefix=".part-", delete=False) as partial:
        try:
            # The URL comes from the configured index, which may be a file: URL on purpose.
            request = urllib.request.Request(link.url)  # noqa: S310
            context = None if link.url.startswith("file:") else _ssl_context(config)
            opened = urllib.request.urlopen(request, timeout=config.timeout, context=context)  # noqa: S310
            with opened as response:
                while chunk := response.read(1 << 20):
                    digest.update(chunk)
                    partial.write(chunk)
        except (urllib.error.URLError, OSError) as error:
            Path(partial.name).unlink(missing_ok=True)
            msg = f"`{spec}`: download of {link.url} failed: {getattr(error, 'reason', error)}"
            raise FetchError(msg) from None
    if link.sha256 and digest.hexdigest() != link.sha256:
        Path(partial.name).unlink(missing_ok=True)
        msg = (
            f"`{spec}`: {link.filename} has sha256 {digest.hexdigest()}, "
            f"the index says {link.sha256}"
        )
        raise FetchError(msg)
    try:
        Path(partial.name).replace(target)
    except OSError as error:
        Path(partial.name).unlink(missing_ok=True)
        msg = f"`{spec}`: cannot keep {link.filename} in {cache}: {error.strerror or error}"
        raise FetchError(msg) from None
    return target
