"""Readiness of a TLS endpoint that serves a given certificate: `python -I tls_ready.py URL CERT`.

Exit 0 when a GET of URL answers 200 over TLS from a server whose certificate chain ends at CERT (the endpoint's
own certificate, trusted as the anchor: a private CA's leaf passes without the CA, and the name the URL uses need
not be one the certificate names, as a host's address often is not). Stdlib only: it runs on the host runtime's
Python, shipped beside the edge.
"""

from __future__ import annotations

import ssl
import sys
import urllib.error
import urllib.request


def main(argv: list[str]) -> int:
    """Probe argv[1] trusting the certificate in argv[2]; print what was seen."""
    url, cert = argv[1], argv[2]
    ctx = ssl.create_default_context(cafile=cert)
    ctx.check_hostname = False
    ctx.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    try:
        with urllib.request.urlopen(url, timeout=3, context=ctx) as resp:
            status = resp.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (OSError, ValueError) as exc:
        print(f"{url}: {getattr(exc, 'reason', exc)}", file=sys.stderr)
        return 1
    print(f"HTTP {status} over TLS")
    return 0 if status == 200 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
