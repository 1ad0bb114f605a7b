"""How kvplan bench talks to the server: one ``Client`` for the readiness probe, the model
discovery, the /metrics scraper and the load generator.

- **Auth and headers.** ``Authorization: Bearer KEY`` (``--api-key``), else HTTP basic auth from
  credentials in the URL, then every ``--header 'Name: value'`` (a header of the same name wins).
  Keys, header values and URL credentials are secrets: held in memory only (never in BenchConfig,
  run.json, the summary, a report or the engine log), shown as ``Name: ***``; ``scrub`` masks them
  wherever a server echoed one back into an error message.
- **Proxies.** One decision for every component: ``proxy_for(url)`` reads ``HTTP_PROXY`` /
  ``HTTPS_PROXY`` / ``NO_PROXY`` (either case) with the standard library's own rules
  (``urllib.request.getproxies`` and ``proxy_bypass``: NO_PROXY entries match a host, a domain
  suffix, ``host:port``, or ``*``; nothing is bypassed unless NO_PROXY says so, loopback included).
  urllib (probe, discovery) gets that proxy through an explicit ``ProxyHandler`` and aiohttp
  (scraper, load) as the ``proxy=`` of each request, so both always agree; aiohttp's own
  ``trust_env`` is left off (it would also send ~/.netrc credentials, which urllib never does).
  A server kvplan launched itself is reached directly (``use_env_proxy=False``): it listens on
  this machine, where a proxy elsewhere cannot reach it. A proxy URL's credentials become a
  ``Proxy-Authorization`` header and are masked wherever the proxy is shown.
"""

from __future__ import annotations

import functools
import re
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field

from kvplan.errors import KvplanError
from kvplan.vllm.startup_log import redact

#: RFC 9110 token characters: what a header name may hold.
_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
#: Headers kvplan (or HTTP itself) must set: a user value would break the requests.
_RESERVED = {"content-length", "transfer-encoding", "connection", "proxy-authorization"}
#: The most of a probe's or the model list's body kvplan reads (300,000 models listed by a lying server
#: made gigabytes); a body cut there is not JSON, and the model list then reads as empty.
MAX_BODY_BYTES = 16 * 1024 * 1024
#: The most of an error answer's body kvplan reads (an API's reason, not a document).
MAX_ERROR_BODY_BYTES = 64 * 1024
#: The most a GET (probe, model list) may take beyond its per-read timeout, headers and body in all.
GET_BODY_S = 20.0
#: Secrets shorter than this are not scrubbed out of text (masking "1" would garble every number).
MIN_SCRUB = 6


def parse_header(text: str, position: int = 1, flag: str = "--header") -> tuple[str, str]:
    """``'Name: value'`` -> ``('Name', 'value')``. The value is a secret: no error repeats it. ``flag``: the option
    it came from, for messages (--header, --prometheus-header)."""
    where = f"{flag} #{position}"
    name, sep, value = str(text).partition(":")
    if not sep:
        raise KvplanError(f"invalid {where}: no colon", f"write it as {flag} 'Name: value'")
    name = name.strip()
    if not name:
        raise KvplanError(f"invalid {where}: the name before the colon is empty", f"write it as {flag} 'Name: value'")
    if not _TOKEN.match(name) or len(name) > 256:
        raise KvplanError(f"invalid {where}: the name holds characters a header name cannot",
                          f"letters, digits and !#$%&'*+-.^_`|~ only, then a colon: {flag} 'X-Token: value'")
    if any(c in value for c in "\r\n\0"):
        raise KvplanError(f"invalid {flag} {name!r}: its value holds a line break or NUL",
                          "a header is one line: pass the value without CR/LF")
    if name.lower() in _RESERVED:
        raise KvplanError(f"invalid {flag} {name!r}: kvplan's HTTP client sets it", "drop this header")
    return name, value.strip(" \t")


def parse_headers(values: Iterable[str] | None, flag: str = "--header") -> tuple[tuple[str, str], ...]:
    """Every ``--header`` (or ``flag``) in order; the same name twice (any case) is refused."""
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    for i, text in enumerate(values or (), start=1):
        name, value = parse_header(text, i, flag)
        if name.lower() in seen:
            raise KvplanError(f"invalid {flag} {name!r}: given twice", "pass each header once")
        seen.add(name.lower())
        out.append((name, value))
    return tuple(out)


def masked_headers(headers: Iterable[tuple[str, str]]) -> list[str]:
    """``['Authorization: ***', ...]``: how headers are shown, anywhere."""
    return [f"{name}: ***" for name, _ in headers]


def scrub(text, secrets: Iterable[str]):
    """``text`` with every secret of at least MIN_SCRUB characters replaced by ``***`` (a server may
    echo a token back in an error body); anything not a string is returned as is."""
    if not isinstance(text, str) or not text:
        return text
    for secret in sorted({s for s in secrets if s and len(s) >= MIN_SCRUB}, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def _with_scheme(proxy: str) -> str:
    return proxy if "://" in proxy else "http://" + proxy


def proxy_for(url: str) -> str | None:
    """The proxy the environment asks for ``url`` (``None``: direct), by the standard library's rules,
    the same for urllib and aiohttp."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return None
    proxies = urllib.request.getproxies()
    proxy = proxies.get(parts.scheme)
    if not proxy or not host:
        return None
    netloc = f"{host}:{port}" if port else host
    if urllib.request.proxy_bypass(netloc) or urllib.request.proxy_bypass(host):
        return None
    return _with_scheme(proxy)


def shown_proxy(proxy: str | None) -> str | None:
    """A proxy URL for messages and files: credentials masked."""

    return None if proxy is None else redact(proxy)


def split_credentials(url: str) -> tuple[str, tuple[str, str] | None]:
    """``http://user:pw@host:port/x`` -> (``http://host:port/x``, (user, pw)); others unchanged."""
    from urllib.parse import unquote, urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
        if "@" not in parts.netloc:
            return url, None
        host = parts.netloc.rpartition("@")[2]
        user = unquote(parts.username or "")
        password = unquote(parts.password or "")
        return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment)), (user, password)
    except ValueError:
        return url, None


def credential_secrets(url: str) -> tuple[str, ...]:
    """What of ``url``'s credentials is secret: the password, ``user:password``, and a user name that
    stands alone (``http://TOKEN@host``: a token in the user part), as given and percent-decoded."""
    from urllib.parse import urlsplit

    try:
        netloc = urlsplit(url).netloc
    except ValueError:
        return ()
    if "@" not in netloc:
        return ()
    raw = netloc.rpartition("@")[0]
    basic = split_credentials(url)[1]
    out = {raw}
    if basic is not None:
        user, password = basic
        out |= {password, f"{user}:{password}"} if password else {user}
        out |= set(raw.split(":", 1)[1:])
        out.add(_basic(user, password).split(" ", 1)[1])  # as the Authorization header carries them
    return tuple(sorted(s for s in out if s))


#: Why no request kvplan sends follows a redirect (urllib and aiohttp alike): the key, the --header values
#: and the URL's credentials go with every request, and a 3xx to another origin would hand them over.
REDIRECT_HINT = ("kvplan does not follow redirects (the key, headers and URL credentials would go with them): "
                 "pass the URL the server redirects to as --url")


def is_redirect(status: int) -> bool:
    return 300 <= status < 400


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """urllib's opener without redirects: a 3xx comes back as the HTTPError it is (``Client.get``)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: PLR0913 - urllib's signature
        return None


def auth_headers(api_key: str | None, basic: tuple[str, str] | None = None) -> dict[str, str]:
    """``Authorization: Bearer KEY`` (vLLM's --api-key), else HTTP basic auth from credentials in the URL."""
    if api_key:
        return {"Authorization": f"Bearer {api_key}"}
    if basic is not None:
        return {"Authorization": _basic(*basic)}
    return {}


def _basic(user: str, password: str) -> str:
    import base64

    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


_split_proxy = split_credentials


@dataclass(frozen=True)
class Client:
    """What every HTTP request of a run carries; see the module docstring. Never stored."""

    api_key: str | None = field(default=None, repr=False)
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    use_env_proxy: bool = True
    #: The credentials of the server URL (``credential_secrets``): masked like the key wherever a server
    #: echoes them back.
    url_secrets: tuple[str, ...] = field(default=(), repr=False)
    #: TLS to an https server: --ca-bundle, the CA certificates (PEM) to verify it with, beside the system's;
    #: --insecure, no verification at all (said in the run's notes).
    ca_bundle: str | None = None
    insecure: bool = False

    def ssl_context(self):
        """The TLS context of every https request of the run: None for Python's default verification."""
        return tls_context(self.ca_bundle, self.insecure)

    def request(self, url: str) -> tuple[str, dict[str, str], str | None]:
        """(url without credentials, headers to send, proxy URL or None) for one request to ``url``."""
        bare, basic = split_credentials(url)
        headers = auth_headers(self.api_key, basic)
        for name, value in self.headers:
            for old in [k for k in headers if k.lower() == name.lower()]:
                del headers[old]
            headers[name] = value
        return bare, headers, proxy_for(bare) if self.use_env_proxy else None

    def proxy(self, url: str) -> str | None:
        return self.request(url)[2]

    def via(self, url: str) -> str:
        """' (through proxy http://***@p:3128)' when ``url`` goes through a proxy, else ''."""
        proxy = self.proxy(url)
        return f" (through the proxy {shown_proxy(proxy)})" if proxy else ""

    def secrets(self) -> list[str]:
        """Header values, the key, and the passwords of proxy URLs in the environment."""
        out = [v for _, v in self.headers]
        if self.api_key:
            out.append(self.api_key)
        out.extend(self.url_secrets)
        for proxy in urllib.request.getproxies().values() if self.use_env_proxy else ():
            basic = _split_proxy(_with_scheme(proxy))[1]
            if basic and basic[1]:
                out.append(basic[1])
        return out

    def scrub(self, text):
        return scrub(text, self.secrets())

    def get(self, url: str, timeout_s: float = 2.0) -> tuple[int, str]:
        """(status, body) of a GET with urllib; status 0 when nothing answered, or when the answer did not
        end within ``timeout_s`` + GET_BODY_S in all: urllib's timeout counts seconds without a byte, so a
        server trickling its headers or body a byte at a time (slowloris) held the probe forever. The GET
        runs in a daemon thread, which a server that never stops is left holding."""
        import threading

        tls = self.ssl_context()  # here, not in the worker: an unreadable --ca-bundle is the caller's one-line error
        deadline = time.monotonic() + timeout_s + GET_BODY_S
        answer: list[tuple[int, str]] = []
        worker = threading.Thread(target=lambda: answer.append(self._get(url, timeout_s, deadline, tls)), daemon=True,
                                  name="kvplan-http-get")
        worker.start()
        worker.join(max(0.0, deadline - time.monotonic()) + 0.5)
        status, body = answer[0] if answer else (0, "")
        if status == 0 and body.startswith(TLS_UNTRUSTED):  # retrying cannot help: say what would
            raise KvplanError(f"{split_credentials(url)[0]}: the server's TLS certificate is not trusted "
                              f"({body[len(TLS_UNTRUSTED):]})", "give its CA with --ca-bundle FILE (PEM), or --insecure")
        return status, body

    def _get(self, url: str, timeout_s: float, deadline: float, tls) -> tuple[int, str]:
        bare, headers, proxy = self.request(url)
        if proxy:
            proxy_url, proxy_basic = _split_proxy(proxy)
            if proxy_basic:
                headers = dict(headers, **{"Proxy-Authorization": _basic(*proxy_basic)})
            handler = urllib.request.ProxyHandler({"http": proxy_url, "https": proxy_url})
        else:
            handler = urllib.request.ProxyHandler({})
        opener = urllib.request.build_opener(handler, *([urllib.request.HTTPSHandler(context=tls)] if tls else []),
                                             _NoRedirects())
        request = urllib.request.Request(bare, headers=headers)
        try:
            with opener.open(request, timeout=timeout_s) as resp:
                body = _read_bounded(resp, deadline)
                return (0, "") if body is None else (resp.status, body)
        except urllib.error.HTTPError as exc:  # its body too: an API says why (Prometheus: {"error": ...})
            try:
                body = _read_bounded(exc, deadline, MAX_ERROR_BODY_BYTES) if exc.fp is not None else ""
            except (OSError, ValueError):
                body = ""
            return exc.code, body or ""
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, ssl.SSLCertVerificationError):
                return 0, TLS_UNTRUSTED + str(exc.reason.verify_message or exc.reason)
            return 0, ""
        except ssl.SSLCertVerificationError as exc:
            return 0, TLS_UNTRUSTED + str(exc.verify_message or exc)
        except (OSError, ValueError):
            return 0, ""

    def aio_kwargs(self, url: str) -> tuple[str, dict]:
        """(bare url, keyword arguments of session.get/post: headers, proxy, proxy_auth)."""
        bare, headers, proxy = self.request(url)
        kwargs: dict = {"headers": headers, "allow_redirects": False}  # see REDIRECT_HINT
        tls = self.ssl_context()
        if tls is not None:
            kwargs["ssl"] = tls
        if proxy:
            import aiohttp

            proxy_url, basic = _split_proxy(proxy)
            kwargs["proxy"] = proxy_url
            if basic:
                kwargs["proxy_auth"] = aiohttp.BasicAuth(basic[0], basic[1])
        return bare, kwargs


def _read_bounded(resp, deadline: float, limit: int = MAX_BODY_BYTES) -> str | None:
    """At most ``limit`` bytes of a response's body (a server may lie about its size), as text; None when it was
    still sending at ``deadline``."""
    parts, size = [], 0
    while size < limit and time.monotonic() < deadline:
        chunk = resp.read1(min(1 << 16, limit - size))
        if not chunk:
            break
        parts.append(chunk)
        size += len(chunk)
    else:
        if time.monotonic() >= deadline:
            return None
    return b"".join(parts).decode(errors="replace")


#: The body `Client._get` returns with status 0 when an https server's certificate failed verification.
TLS_UNTRUSTED = "\x00tls-untrusted:"


@functools.lru_cache(maxsize=8)
def tls_context(ca_bundle: str | None, insecure: bool):
    """None (Python's default verification), or the context --ca-bundle / --insecure ask for. A bundle that cannot
    be read is one line, exit 2."""
    if not ca_bundle and not insecure:
        return None
    ctx = ssl.create_default_context()
    if insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx
    try:
        ctx.load_verify_locations(cafile=ca_bundle)
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise KvplanError(f"cannot read --ca-bundle {ca_bundle}: {getattr(exc, 'strerror', None) or exc}",
                          "give a file of PEM CA certificates") from None
    return ctx
