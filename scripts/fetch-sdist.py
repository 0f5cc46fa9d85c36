#!/usr/bin/env python3
"""Fetches one source distribution through pip's configured package index, checked by its sha256.

Usage: fetch-sdist.py PROJECT VERSION SHA256 OUT

For an sdist that `pip download` cannot fetch (pip builds its metadata first, and some fail to):
the index is the one pip itself would use (`pip config list`: PIP_INDEX_URL, then pip.conf's
download or global index-url; pip's own default when none is set), read through its "simple"
page (PEP 503), with pip's configured certificate bundle. No registry's address is written here.
"""
import hashlib
import html.parser
import os
import ssl
import subprocess
import sys
import urllib.parse
import urllib.request


def pip_settings():
    """pip's effective settings, as `pip config list` prints them (`scope.key='value'`)."""
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"],
        check=True, capture_output=True, text=True,
    ).stdout
    settings = {}
    for line in listed.splitlines():
        name, _, value = line.partition("=")
        settings[name.strip()] = value.strip().strip("'\"")
    return settings


def configured(settings, key):
    """The value pip uses for `key`: the environment first, then the download command's, then global."""
    for scope in (":env:", "download", "global"):
        if f"{scope}.{key}" in settings:
            return settings[f"{scope}.{key}"]
    return None


def default_index():
    """pip's built-in index, asked of pip rather than written here."""
    from pip._internal.models.index import PyPI  # pip's own constant; only when nothing is configured

    return PyPI.simple_url


class Links(html.parser.HTMLParser):
    """The `href`s of a PEP 503 simple page."""

    def __init__(self):
        super().__init__()
        self.hrefs = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self.hrefs += [value for name, value in attrs if name == "href" and value]


def normalized(project):
    """PEP 503's normalized project name."""
    out = []
    for ch in project.lower():
        out.append("-" if ch in "._-" else ch)
    return "".join(out)


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__.split("\n\n")[1])
    project, version, digest, out = sys.argv[1:]
    settings = pip_settings()
    index = configured(settings, "index-url") or default_index()
    cert = configured(settings, "cert")
    context = ssl.create_default_context(cafile=cert) if cert else None

    def get(url):
        with urllib.request.urlopen(url, timeout=120, context=context) as response:
            return response.geturl(), response.read()

    page_url = index.rstrip("/") + "/" + normalized(project) + "/"
    try:
        page_url, page = get(page_url)
    except OSError as err:
        sys.exit(f"fetch-sdist: cannot read {page_url} (pip's configured index): {err}")
    parser = Links()
    parser.feed(page.decode("utf-8", "replace"))
    wanted = {f"{project}-{version}.tar.gz", f"{normalized(project).replace('-', '_')}-{version}.tar.gz"}
    links = [h for h in parser.hrefs if urllib.parse.urlsplit(h).path.rsplit("/", 1)[-1] in wanted]
    if not links:
        sys.exit(f"fetch-sdist: {page_url} lists no {' or '.join(sorted(wanted))}")
    url = urllib.parse.urljoin(page_url, urllib.parse.urldefrag(links[0])[0])
    try:
        _, data = get(url)
    except OSError as err:
        sys.exit(f"fetch-sdist: cannot download {url}: {err}")
    if hashlib.sha256(data).hexdigest() != digest:
        sys.exit(f"fetch-sdist: {url} does not have the expected sha256 {digest}")
    partial = out + ".partial"
    with open(partial, "wb") as f:
        f.write(data)
    os.replace(partial, out)
    print(f"fetch-sdist: {project} {version} from {url}", file=sys.stderr)


if __name__ == "__main__":
    main()
