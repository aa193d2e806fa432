"""Access: which Hub a stream talks to and with which token, decided once per open.

    access = await find_access(token=None, endpoint=None)   # from the environment, now
    access.endpoint   # "https://huggingface.co", or $HF_ENDPOINT, or endpoint=
    access.token      # token=, else $HF_TOKEN, else the `hf auth login` token file

Every reader of a stream (the resolver, the fetcher, a video reader, LeRobot's tables, the
webdataset hook, the CLI) gets the same ``Access``, made once when the stream (or reader)
opens, so that what the listing used is what the reads use. The environment is read at
that time, not when a module was imported: a program (or a test) that sets
``HF_ENDPOINT`` or ``HF_TOKEN`` after importing ``huggingface_hub`` is obeyed.

The order is huggingface_hub's:

- endpoint: ``endpoint=``, else ``HF_ENDPOINT``, else ``https://huggingface.co``;
- token: ``token=`` (a string; ``False`` for none), else nothing when
  ``HF_HUB_DISABLE_IMPLICIT_TOKEN`` is set, else ``HF_TOKEN`` (or the older
  ``HUGGING_FACE_HUB_TOKEN``), else the token file: ``HF_TOKEN_PATH``, else
  ``$HF_HOME/token`` (``HF_HOME`` defaults to ``$XDG_CACHE_HOME/huggingface``, then
  ``~/.cache/huggingface``), which ``hf auth login`` writes. Where that file is the one
  huggingface_hub itself reads, its ``get_token()`` reads it (an OAuth login is
  refreshed there, and ``HF_OIDC_RESOURCE`` is honoured);
- offline: ``HF_HUB_OFFLINE``: a request to the Hub endpoint fails at once, naming it.

A token is sent to its endpoint's own origin (scheme, host, port) only: never to a CDN a
file redirects to, nor to any other host (``auth_headers``).
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import anyio.to_thread
import httpx2

from ._exceptions import SourceError

__all__ = [
    "DEFAULT_ENDPOINT",
    "Access",
    "auth_headers",
    "check_token",
    "default_endpoint",
    "find_access",
    "find_access_nowait",
    "normalize_endpoint",
    "origin",
    "token_file",
]

#: The Hub used when neither ``endpoint=`` nor ``HF_ENDPOINT`` names another.
DEFAULT_ENDPOINT = "https://huggingface.co"
_TRUE = frozenset({"1", "on", "yes", "true"})
#: The longest token accepted (Hub tokens are ~40 characters; OAuth ones a few hundred).
MAX_TOKEN_LENGTH = 4096


@functools.lru_cache(maxsize=64)
def origin(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of a URL: what a token is scoped to, and a gate keyed by."""
    u = httpx2.URL(url)
    default = {"http": 80, "https": 443}.get(u.scheme, 0)
    return u.scheme, u.host.lower(), u.port or default


def auth_headers(url: str, token: str | None, endpoint: str) -> dict[str, str]:
    """The Authorization header for ``url``: only when it is on ``endpoint``'s origin."""
    if token and origin(url) == origin(endpoint):
        return {"Authorization": f"Bearer {token}"}
    return {}


def normalize_endpoint(value: str, what: str = "endpoint") -> str:
    """``value`` as an endpoint (no trailing slash), or a SourceError naming ``what``."""
    if not isinstance(value, str):
        raise SourceError(f"{what}={value!r} is not a URL: pass a string like {DEFAULT_ENDPOINT!r}")
    value = value.strip().rstrip("/")
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise SourceError(
            f"Hub {what} {value!r} is not an http(s) URL like {DEFAULT_ENDPOINT}: "
            "fix endpoint= or HF_ENDPOINT"
        )
    try:
        origin(value)
    except httpx2.InvalidURL as exc:
        raise SourceError(f"Hub {what} {value!r} is not a valid URL: {exc}") from exc
    return value


def default_endpoint() -> str:
    """``HF_ENDPOINT`` as it is now, else the public Hub."""
    env = os.environ.get("HF_ENDPOINT", "").strip()
    return normalize_endpoint(env, "HF_ENDPOINT") if env else DEFAULT_ENDPOINT


def check_token(
    token: object, where: str = "token=", fix: str = "check what was pasted (a line break?)"
) -> str | None:
    """A token as sent (stripped), None for an empty one; a SourceError for one that
    cannot go in a header (not a string, control or non-ASCII characters, too long).
    ``where`` names where it came from, ``fix`` the way out; no message shows the token."""
    if not isinstance(token, str):
        raise SourceError(
            f"{where} must be a string (or False for no token), not {type(token).__name__}"
        )
    token = token.strip()
    if len(token) > MAX_TOKEN_LENGTH:
        raise SourceError(f"{where}: a token of {len(token)} characters is not a Hub token: {fix}")
    if any(not (0x21 <= ord(c) <= 0x7E) for c in token):
        raise SourceError(
            f"{where}: the token holds a space, a control or a non-ASCII character, which "
            f"no HTTP header may carry: {fix}"
        )
    return token or None


def token_file() -> Path:
    """Where ``hf auth login`` keeps the token, by the environment as it is now."""
    path = os.environ.get("HF_TOKEN_PATH", "").strip()
    if path:
        return Path(path).expanduser()
    home = os.environ.get("HF_HOME", "").strip()
    if not home:
        cache = os.environ.get("XDG_CACHE_HOME", "").strip() or str(Path("~/.cache"))
        home = str(Path(cache) / "huggingface")
    return Path(home).expanduser() / "token"


@dataclass(frozen=True)
class Access:
    """The endpoint, token and offline flag of one stream or reader."""

    endpoint: str = DEFAULT_ENDPOINT
    token: str | None = field(default=None, repr=False)
    offline: bool = False
    #: Where the token came from, for messages: "token=", "$HF_TOKEN", a file's path.
    token_source: str = ""

    @property
    def identity(self) -> str:
        """Whose cache entries these are: a truncated sha256 of the token ("" for none)."""
        if not self.token:
            return ""
        return hashlib.sha256(self.token.encode("utf-8", "surrogatepass")).hexdigest()[:32]

    def headers_for(self, url: str) -> dict[str, str]:
        """The Authorization header for ``url``: only on the endpoint's own origin."""
        return auth_headers(url, self.token, self.endpoint)

    def check_online(self, url: str) -> None:
        """Raise ``SourceError`` for a request to the Hub while ``HF_HUB_OFFLINE`` is set."""
        if self.offline and self.is_hub(url):
            raise SourceError(
                f"{url}: HF_HUB_OFFLINE is set, and streaming reads the Hub ({self.endpoint}) "
                "over the network: unset HF_HUB_OFFLINE, or stream local files instead"
            )

    def is_hub(self, url: str) -> bool:
        try:
            return origin(url) == origin(self.endpoint)
        except httpx2.InvalidURL:
            return False


def find_access_nowait(
    token: str | bool | None = None, endpoint: str | None = None
) -> tuple[Access, bool]:
    """The access from the arguments and the environment, reading no file; the flag
    says the token file must still be read (``find_access`` does)."""
    end = default_endpoint() if endpoint is None else normalize_endpoint(endpoint)
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE
    if token is False:
        return Access(end, None, offline), False
    if token is not None and token is not True:
        return Access(end, check_token(token), offline, "token="), False
    implicit_off = os.environ.get("HF_HUB_DISABLE_IMPLICIT_TOKEN", "").strip().lower() in _TRUE
    if token is None and implicit_off:
        return Access(end, None, offline), False
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        env = os.environ.get(name, "")
        if env.strip():
            fix = f"fix or unset {name} (the token file is read when it is unset)"
            return Access(end, check_token(env, f"${name}", fix), offline, f"${name}"), False
    return Access(end, None, offline), True


async def find_access(token: str | bool | None = None, endpoint: str | None = None) -> Access:
    """The access of a stream opening now: ``token=`` / ``endpoint=`` if given, else the
    environment (see the module's docstring). ``token=True`` asks for the implicit token
    even where ``HF_HUB_DISABLE_IMPLICIT_TOKEN`` is set."""
    access, read_file = find_access_nowait(token, endpoint)
    if not read_file:
        return access
    # A file read (and huggingface_hub's get_token() may refresh an OAuth token over
    # the network): off the event loop.
    found = await anyio.to_thread.run_sync(_token_from_file)
    source = f"the token file {token_file()}" if found else ""
    return Access(access.endpoint, found, access.offline, source)


def _token_from_file() -> str | None:
    path = token_file()
    where = f"the token file {path}"
    fix = "log in again (hf auth login), fix or delete the file, or pass token="
    # huggingface_hub's get_token() (its import: 80-100 ms, a fresh process's largest cost
    # in opening a video it already knows) is needed for what it adds to reading the
    # file: OIDC, a refreshed OAuth login (in the file), Colab's secrets.
    if os.environ.get("HF_OIDC_RESOURCE") or (
        _is_hub_library_path(path) and (path.exists() or "google.colab" in sys.modules)
    ):
        from huggingface_hub import get_token

        try:
            found = get_token()
        except UnicodeError:
            raise SourceError(f"{where} is not UTF-8 text: {fix}") from None
        except OSError as exc:
            raise SourceError(f"cannot read {where} ({exc}): {fix}") from exc
        return None if found is None else check_token(found, where, fix)
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_TOKEN_LENGTH + 1)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise SourceError(
            f"cannot read the token file {path} ({exc}): fix its permissions, pass token=, "
            "or set HF_TOKEN"
        ) from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise SourceError(f"{where} is not UTF-8 text: {fix}") from None
    return check_token(text, where, fix)


def _is_hub_library_path(path: Path) -> bool:
    """True when ``path`` is the token file huggingface_hub's own constants name (so its
    ``get_token`` reads the same file, and refreshes an OAuth login there)."""
    try:
        from huggingface_hub import constants
    except ImportError:  # pragma: no cover - a dependency
        return False
    try:
        return Path(constants.HF_TOKEN_PATH).expanduser().resolve() == path.resolve()
    except OSError:
        return False
