"""Redis URLs as text, for people: every credential hidden, and a malformed URL named
before anything connects. Apart from connection.py so that saying which server a
command talks to (every `--help`) does not import redis-py."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

# The query options a URL may carry: redis-py's own (a single server), and what
# connection.py reads for a sentinel set. Anything else failed at the first connection
# with a TypeError from deep in redis-py, or was silently ignored. (redis-py also parses
# ``timeout``, but only its blocking pool takes it: here it was that TypeError.)
# The schemes connection.py connects to, each with its "//".
SCHEMES = ("redis://", "rediss://", "unix://", "redis+cluster://", "rediss+cluster://",
           "redis+sentinel://", "rediss+sentinel://")
_SHAPE = "redis://host:6379/0"

OPTIONS = frozenset({
    "db", "health_check_interval", "max_connections", "retry_on_error", "retry_on_timeout",
    "socket_connect_timeout", "socket_keepalive", "socket_timeout", "ssl_check_hostname",
    "username", "password", "client_name", "protocol", "ssl_cert_reqs", "ssl_ca_certs", "ssl_certfile",
    "ssl_keyfile", "sentinel_username", "sentinel_password",
})


# The longest an option's seconds may be, as any setting's (config.MAX_SECONDS, ten
# years): a finite 1e308 overflowed a socket's timeout (OverflowError) at the connection.
MAX_SECONDS = 315_360_000
_SECONDS = f"seconds (a number from 0 to {MAX_SECONDS:,})"


def _seconds(v: str) -> bool:
    try:
        return 0 <= float(v) <= MAX_SECONDS
    except ValueError:
        return False


def _whole_seconds(v: str) -> bool:
    # redis-py reads this one with int(): "1.5" or "1e3" was its ValueError.
    return v.isdigit() and int(v) <= MAX_SECONDS


def _whole(least: int) -> Any:
    return lambda v: v.isdigit() and int(v) >= least


_FLAGS = ("true", "false", "yes", "no", "1", "0", "on", "off")
# What each option's value must be, said as the error says it. redis-py refused these
# with a bare ValueError or TypeError (a traceback), or read "maybe" as true.
_VALUES: dict[str, tuple[Any, str]] = {
    "db": (lambda v: v.isdigit() and int(v) < 2**31, "a database number (0, 1, ...)"),
    # Redis refuses a name with a space or anything past printable ASCII at the connection.
    "client_name": (lambda v: all("!" <= c <= "~" for c in v), "printable ASCII without spaces"),
    "socket_timeout": (_seconds, _SECONDS),
    "socket_connect_timeout": (_seconds, _SECONDS),
    "health_check_interval": (_whole_seconds, f"whole seconds (0 to {MAX_SECONDS:,})"),
    "max_connections": (_whole(1), "a whole number, 1 or more"),
    "protocol": (lambda v: v in ("2", "3"), "2 or 3"),
    "retry_on_timeout": (lambda v: v.lower() in _FLAGS, "true or false"),
    "socket_keepalive": (lambda v: v.lower() in _FLAGS, "true or false"),
    "ssl_check_hostname": (lambda v: v.lower() in _FLAGS, "true or false"),
    "ssl_cert_reqs": (lambda v: v.lower() in ("none", "optional", "required"), "none, optional or required"),
}
_TLS_ONLY = ("ssl_cert_reqs", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_check_hostname")


def _bad_value(url: str, parts: Any) -> str | None:
    """What is wrong with an option's value (or a database path), said with what to write."""
    tls = parts.scheme.startswith("rediss")
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key in _TLS_ONLY and not tls:
            return (f"{redact(url)}: option {key} applies to TLS connections only: use a rediss:// URL, "
                    "or leave the option out")
        check = _VALUES.get(key)
        if check is not None and not check[0](value):
            shown = "***" if "password" in key else value
            return f"{redact(url)}: option {key}={shown!r} must be {check[1]}; fix it in the URL"
    db = parts.path.strip("/")
    if parts.scheme in ("redis", "rediss") and db and not (db.isdigit() and int(db) < 2**31):
        return (f"{redact(url)}: the path names the database, a number below the server's `databases` "
                f"(redis://host:6379/0); got {db!r}")
    return None


def same_server(a: str, b: str) -> bool:
    """Whether two single-server URLs name the same server and database (the default
    port and database filled in; ``localhost`` is 127.0.0.1)."""
    def norm(url: str) -> tuple[str, str, int, str] | None:
        try:
            p = urlsplit(url)
            port = p.port or 6379
        except ValueError:
            return None
        host = (p.hostname or "").lower()
        host = "127.0.0.1" if host == "localhost" else host
        return p.scheme, host, port, p.path.strip("/") or "0"

    na, nb = norm(a), norm(b)
    return na is not None and na == nb


def _secret(key: str) -> bool:
    """Whether a query option's name says it holds a credential (known or not)."""
    key = key.lower()
    return any(w in key for w in ("pass", "secret", "token"))


def redact(url: str) -> str:
    """A Redis URL fit for logs: every credential replaced by ***: the userinfo's
    password (or the whole userinfo when it has no colon: redis-py may read it as one),
    and every query option that names a password (``?password=``,
    ``?sentinel_password=``). Read as text, not parsed, so it holds for a URL that does
    not parse too: the userinfo is everything between the ``//`` and the last ``@``,
    whatever it holds (a password with a ``/``, ``?`` or ``#`` not percent-encoded put
    the start of the host, or the whole path, inside it), and a fragment (a ``#`` and
    what follows: the rest of such a password) never shows. Works on the multi-host
    netlocs of cluster and sentinel URLs too (``user:pw@h1:p1,h2:p2``)."""
    head, slashes, rest = url.partition("//")
    if not slashes:
        head, rest = "", url
    # unix:///path has no userinfo (its path may hold an "@"); unix://user:pw@/path has.
    auth, at, tail = ("", "", rest) if rest.startswith("/") else rest.rpartition("@")
    if not at:
        tail = rest
    where, hash_, _ = tail.partition("#")
    place, question, query = where.partition("?")
    # Keys read decoded, as redis-py reads them: ?pass%77ord= is its password too.
    pairs = parse_qsl(query, keep_blank_values=True)
    secret_query = any(_secret(k) for k, _ in pairs)
    if not at and not secret_query and not hash_:
        return url  # as given
    if at:
        user, colon, _ = auth.partition(":")
        # A name that holds a reserved character is a misread URL: hidden with the rest.
        auth = f"{user}:***" if colon and not any(c in user for c in "/?#[]") else "***"
    if secret_query:
        # A name no option has, beside a password, may be the rest of that password (an
        # "&" not percent-encoded in it): hidden too.
        query = urlencode([("***" if k not in OPTIONS else k, "***" if _secret(k) or k not in OPTIONS else v)
                           for k, v in pairs], safe="*")
    return (head + slashes + (auth + "@" if at else "") + place + (question + query if question else "")
            + ("#***" if hash_ else ""))


# What names a password and its separator (``sentinel_password=``, ``'password': ``); the
# value after it is found by _hide_passwords. No quantifier nests and the literal comes first,
# so a search costs one pass: the old single pattern began with \w*password and tried
# every start in a run of word characters (quadratic: a 32,000-letter word beside an "@"
# in a log line held the GIL for 4 s).
_PASSWORD = re.compile(r"""password['"]?\s*[=:]\s*""", re.IGNORECASE)
_BLANK = re.compile(r"\s")
# Characters of one log line (or error) scrub reads; past them the line is cut (see scrub).
SCAN_CHARS = 65_536


_WORD = re.compile(r"\w*")
_SPACE = re.compile(r"\s*")
_STOP = re.compile(r"[,&>)]")  # where an unquoted value may end (before its line's end)


def _word_end(text: str, i: int, end: int) -> int:
    m = _WORD.match(text, i, end)
    return m.end() if m else i


def _space_end(text: str, i: int) -> int:
    m = _SPACE.match(text, i)
    return m.end() if m else i


def _closes(text: str, after: int) -> bool:
    """Whether a quote ends a value here: the next non-space is one of ``,})]``, or a line
    ends first."""
    j = _space_end(text, after)
    return j == len(text) or text[j] in ",})]" or "\n" in text[after:j]


def _next_setting(text: str, t: int, line_end: int) -> bool:
    """Whether an unquoted value ends at ``t``: the next setting (``,name=``, ``, 'name':``,
    ``&name=``), the closing ``)>`` or ``>`` of a repr, a ``)`` that ends the line, or the
    line's end."""
    if t >= line_end:
        return True
    c = text[t]
    if c == ",":
        j = _space_end(text, t + 1)  # the next setting may begin on the next line
        j += j < len(text) and text[j] in "'\""
        w = _word_end(text, j, len(text))
        if w == j:
            return False
        w += w < len(text) and text[w] in "'\""
        w = _space_end(text, w)
        return w < len(text) and text[w] in "=:"
    if c == "&":
        w = _word_end(text, t + 1, line_end)
        return w > t + 1 and w < line_end and text[w] == "="
    if c == ">":
        return True
    if c == ")":
        return (t + 1 < line_end and text[t + 1] == ">") or _closes_line(text, t + 1)
    return False


def _closes_line(text: str, after: int) -> bool:
    j = _space_end(text, after)
    return j == len(text) or "\n" in text[after:j]


def _hide_passwords(text: str) -> str:
    """Every password's whole value replaced by ***, whatever it holds (a comma, a space,
    a quote): a quoted one up to a closing quote that a setting's end follows, else up to
    the next setting or the end of the line. One pass: a quote with no valid close on its
    line is remembered, so a line of many such values is not read again for each."""
    out: list[str] = []
    copied = 0
    # quote -> (a start, its line's end) past which that line holds no valid close of it
    unclosed: dict[str, tuple[int, int]] = {}
    m = _PASSWORD.search(text)
    while m is not None:
        start = m.end()
        line_end = text.find("\n", start)
        line_end = len(text) if line_end < 0 else line_end
        end = -1
        quote = text[start] if start < line_end and text[start] in "'\"" else ""
        known = unclosed.get(quote)
        if quote and not (known is not None and known[0] <= start and known[1] == line_end):
            p = text.find(quote, start + 1, line_end)
            while p >= 0 and not _closes(text, p + 1):
                p = text.find(quote, p + 1, line_end)
            if p >= 0:
                end = p + 1
            else:
                unclosed[quote] = (start, line_end)
        if end >= 0:
            out.append(text[copied:start] + quote + "***" + quote)
        else:
            end = line_end
            stop = _STOP.search(text, start, line_end)
            while stop is not None and not _next_setting(text, stop.start(), line_end):
                stop = _STOP.search(text, stop.start() + 1, line_end)
            if stop is not None:
                end = stop.start()
            out.append(text[copied:start] + "***")
        copied = end
        m = _PASSWORD.search(text, max(end, m.end()))
    out.append(text[copied:])
    return "".join(out)


def scrub(text: str) -> str:
    """``text`` (an error's message, a log line) with every credential hidden: the
    userinfo of a URL in it, and every ``password=...`` (redis-py's errors repeat a
    connection's settings, a Sentinel's password included). Linear in the text, and it
    reads at most SCAN_CHARS of it: a longer text that holds anything to hide is cut
    there, the word across the cut dropped too (it could be half a URL whose ``@`` is
    past the cut), and says how much was cut."""
    if "assword" not in text and "@" not in text:
        return text
    cut = ""
    if len(text) > SCAN_CHARS:
        head = text[:SCAN_CHARS]
        head = head[:max(head.rfind(" "), head.rfind("\n"), head.rfind("\t")) + 1]
        cut = f"[{len(text) - len(head):,} more characters cut]"
        text = head
    return _hide_userinfo(_hide_passwords(text)) + cut


def _hide_userinfo(text: str) -> str:
    """Every URL's userinfo in ``text`` hidden: from its ``://`` to the last ``@`` before
    the next blank, whatever it holds (a password with a ``/`` or ``#`` not encoded), as
    redact reads one URL (``unix:///path`` has none). One pass: each run of non-blanks is
    read once."""
    out: list[str] = []
    copied = 0
    start = text.find("://")
    while start >= 0:
        blank = _BLANK.search(text, start)
        end = blank.start() if blank else len(text)
        at = text.rfind("@", start, end)
        while 0 <= start < at and text.startswith("/", start + 3):
            start = text.find("://", start + 3, at)
        if 0 <= start < at:
            user, colon, _ = text[start + 3:at].partition(":")
            shown = f"{user}:***" if colon and not any(c in user for c in "/?#[]") else "***"
            out.append(text[copied:start + 3] + shown)
            copied = at
        start = text.find("://", end)
    out.append(text[copied:])
    return "".join(out)


_ENCODE = ("percent-encode the password ('/' as %2F, '?' as %3F, '#' as %23, '@' as %40, '%' as %25: "
           "urllib.parse.quote(password, safe=''))")


def _reserved_in_userinfo(url: str) -> str | None:
    """What to say of a user name or password holding a character a URL reserves, not
    percent-encoded: a ``/``, ``?`` or ``#`` ends the host's part of the URL, so the rest
    of the password was read as the path or the query, and its start as the host and a bad
    port. A ``#`` anywhere is one too: a Redis URL has no fragment, and redis-py drops it
    (a query's password cut short)."""
    rest = url.partition("//")[2] or url
    if "#" in rest:
        return f"{redact(url)}: a Redis URL holds no '#' (it ends the URL there): {_ENCODE}"
    if rest.startswith("/"):
        return None  # unix:///path: no userinfo, and a socket's path may hold an "@"
    at = rest.rfind("@")
    cut = min((i for i in (rest.find(c) for c in "/?") if i >= 0), default=-1)
    if at < 0 or not 0 <= cut < at:
        return None
    # An "@" in the path (a database number) is never right; one in the query may be an
    # option's value (?client_name=a@b) when what stands before the path reads as hosts.
    in_path = rest[cut] == "/" and "@" in rest[cut:].partition("?")[0]
    if in_path or not _hosts_read(rest[:cut]):
        return (f"{redact(url)}: the user name or password holds {rest[cut]!r}, which ends the host's part "
                f"of a URL: {_ENCODE}")
    return None


def _hosts_read(netloc: str) -> bool:
    """Whether a netloc without userinfo is hosts, each with a port of digits or none."""
    for host in netloc.split(","):
        name, colon, port = host.rpartition(":") if not host.endswith("]") else (host, "", "")
        if colon and not (name and port.isdigit()):
            return False
    return True


def problem(url: str) -> str | None:
    """What is wrong with a Redis URL's hosts, ports and options, or None (the scheme is
    connection.py's to check). Said with the URL redacted."""
    if not url.startswith(SCHEMES):
        # Said before anything is parsed: without its "//", a URL's userinfo reads as its
        # scheme or its path (a database), and was quoted as one.
        scheme, slashes, _ = url.partition("://")
        got = f"the scheme {scheme + slashes!r}" if slashes and "@" not in scheme else "no scheme followed by '//'"
        return (f"{redact(url)}: a Redis URL starts with its scheme and '//' ({', '.join(SCHEMES)}), "
                f"as in {_SHAPE}; this one has {got}")
    if (reserved := _reserved_in_userinfo(url)) is not None:
        return reserved
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        return f"{redact(url)} is not a URL: {exc}"
    if parts.scheme.startswith("unix"):
        hosts: list[str] = []
    else:
        hosts = [h.strip() for h in parts.netloc.rpartition("@")[2].split(",")]
    for host in hosts:
        name, colon, port = host.rpartition(":") if not host.endswith("]") else (host, "", "")
        if not colon:
            continue  # the default port
        if not name or not port.isdigit() or not 1 <= int(port) <= 65535:
            return f"{redact(url)}: the port of {host!r} must be a number from 1 to 65535"
    known = OPTIONS if "sentinel" in parts.scheme else OPTIONS - {"sentinel_username", "sentinel_password"}
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    unknown = sorted({k for k, _ in pairs} - known)
    if unknown:
        if any(_secret(k) for k, _ in pairs):
            # Beside a password, an unknown name may be the rest of it: named by none.
            return (f"{redact(url)}: {len(unknown)} unknown option(s), not shown as the URL holds a password (one "
                    f"with an unencoded '&' reads as a password and an option: percent-encode '&' as %26) "
                    f"(known: {', '.join(sorted(known))})")
        return f"{redact(url)}: unknown option(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})"
    return _bad_value(url, parts)
