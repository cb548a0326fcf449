"""Read-only ONTAP REST client: GETs over verified HTTPS with basic auth, nothing else.

Why plain HTTPS (aiohttp) and not NetApp's `netapp-ontap` library: `validate --ontap` reads
five collections and must choose each `fields=` list by the cluster's release (a field the
release lacks is an HTTP 400, https://github.com/NetApp/harvest/issues/2237); the library
adds a pinned-per-release schema and its own error types on top of the same GETs, while
aiohttp is already a kvops dependency, verifies TLS by default and runs the GETs
concurrently. The API contract followed: https://docs.netapp.com/us-en/ontap-automation/
rest/input_variables.html (fields, filters, `max_records`, `_links.next`) and
rest/interpret_api_response.html (the `{"error": {...}}` body).

Every failure becomes one `OntapError` line (wrong password, certificate that does not
verify, missing privilege, unreachable address); the password never appears in it.
"""

from __future__ import annotations

import base64
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp

from kvops.errors import RC, KvopsError


class OntapError(KvopsError):
    """ONTAP could not be read: `kvops validate --ontap` exits 2 with this one line."""

    rc = RC.COULD_NOT_RUN


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str = field(repr=False)

    def basic_auth(self) -> str:
        """RFC 7617 basic credentials (UTF-8), the scheme ONTAP's REST API accepts."""
        token = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
        return f"Basic {token}"


def tls_context(ca_file: Path | None) -> ssl.SSLContext:
    """Verifying context: the system trust store, or exactly the given CA bundle."""
    if ca_file is None:
        return ssl.create_default_context()
    try:
        return ssl.create_default_context(cafile=str(ca_file))
    except (OSError, ssl.SSLError) as exc:
        raise OntapError(f"ONTAP CA file {ca_file}: cannot load ({exc})") from exc


def _error_text(body: Any) -> str:
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return ""
    code = f" (code {error['code']})" if error.get("code") not in (None, "") else ""
    return f"{error.get('message', '')}{code}"


class OntapClient:
    """`async with OntapClient(host, creds, ca_file) as api: await api.get_all(...)`."""

    def __init__(
        self,
        host: str,
        credentials: Credentials,
        ca_file: Path | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        self.host = host
        self._credentials = credentials
        self._ssl = tls_context(ca_file)
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> OntapClient:
        self._session = aiohttp.ClientSession(
            base_url=f"https://{self.host}",
            connector=aiohttp.TCPConnector(ssl=self._ssl),
            timeout=self._timeout,
            headers={
                "Accept": "application/json",
                "Authorization": self._credentials.basic_auth(),
            },
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._session is not None:
            await self._session.close()

    async def get(self, path: str, params: dict[str, str] | None = None) -> dict[str, Any]:
        """GET /api/<path> (or a `_links.next.href` as given) → the JSON body."""
        assert self._session is not None, "use `async with OntapClient(...)`"
        url = path if path.startswith("/api/") else f"/api/{path}"
        where = f"ONTAP {self.host}"
        try:
            async with self._session.get(url, params=params) as response:
                try:
                    body = await response.json(content_type=None)
                except ValueError:
                    body = None
                status = response.status
        except aiohttp.ClientConnectorCertificateError as exc:
            raise OntapError(
                f"{where}: TLS certificate not verified ({exc.certificate_error}); give the "
                "cluster's CA with --ontap-ca-file or ontap_export_ca_file"
            ) from None
        except aiohttp.ClientSSLError as exc:
            raise OntapError(f"{where}: TLS handshake failed ({exc})") from None
        except aiohttp.ClientError as exc:
            raise OntapError(f"{where}: cannot connect ({exc})") from None
        except TimeoutError:
            raise OntapError(f"{where}: no answer within {self._timeout.total:.0f} s") from None
        if status == 401:
            raise OntapError(
                f"{where} refused the credentials of user {self._credentials.username!r} "
                "(HTTP 401): check KVOPS_ONTAP_USERNAME / KVOPS_ONTAP_PASSWORD"
            )
        if status == 403:
            raise OntapError(
                f"{where}: user {self._credentials.username!r} may not read {url} (HTTP 403"
                f"{': ' + _error_text(body) if _error_text(body) else ''}): grant the REST "
                "role readonly access to it (README: ONTAP privileges)"
            )
        if status >= 400 or not isinstance(body, dict):
            detail = _error_text(body) or "no JSON body"
            raise OntapError(f"{where}: GET {url} answered HTTP {status}: {detail}")
        return body

    async def get_all(self, path: str, params: dict[str, str]) -> list[dict[str, Any]]:
        """Every record of a collection, following `_links.next.href` verbatim (it carries
        the original query plus a cursor)."""
        records: list[dict[str, Any]] = []
        body = await self.get(path, params)
        for _ in range(10_000):
            records.extend(r for r in body.get("records", []) if isinstance(r, dict))
            href = ((body.get("_links") or {}).get("next") or {}).get("href")
            if not href:
                return records
            body = await self.get(str(href))
        raise OntapError(f"ONTAP {self.host}: {path} pages without end")
