"""Real English prose made offline: the manual pages installed on this machine.

    python -m tools.datamakers.manpage_corpus OUT_FOLDER [--max-characters N]

Unlabelled text for pretraining a language model: every English manual page under
`/usr/share/man/man1`-`man8`, its roff markup stripped to prose (`roff_to_text`), one .txt
file per page, as the LM pipeline reads a folder. Left out: pages that only include
another (`.so`), verbatim blocks, pages of packages whose manuals are generated
(`GENERATED_PACKAGES`: the Google Cloud CLI's 16,000 near-identical pages), and pages of the
packages in `hold_out_sources` (a labelled task's).
"""

from __future__ import annotations

import argparse
import glob
import gzip
import hashlib
import os
import re
import sys
from collections.abc import Iterable

MAN_ROOT = "/usr/share/man"
DPKG_INFO = "/var/lib/dpkg/info"
DPKG_STATUS = "/var/lib/dpkg/status"
GENERATED_PACKAGES = ("google-cloud-cli",)

# Requests that start a new paragraph; their arguments (a heading, a tag) are kept as text.
_BREAKS = {"SH", "SS", "PP", "LP", "P", "TP", "IP", "HP", "sp", "br", "Sh", "Ss", "Pp", "It"}
# Requests whose arguments are running text (fonts, mdoc's inline macros).
_INLINE = {"B", "I", "BR", "BI", "IB", "IR", "RB", "RI", "SM", "SB", "UR", "MT", "Nm", "Nd",
           "Ar", "Fl", "Cm", "Pa", "Xr", "Em", "Sy", "Li", "Dq", "Sq", "Ql", "Va", "Fn", "Ev"}
_VERBATIM = {"nf": "fi", "Vb": "Ve", "EX": "EE", "Bd": "Ed"}
_SPECIAL = {"em": "-", "en": "-", "mi": "-", "hy": "-", "lq": '"', "rq": '"', "dq": '"',
            "aq": "'", "oq": "'", "cq": "'", "ga": "`", "bu": "*", "co": "(c)", "ti": "~",
            "ha": "^", "rs": "\\", "Aq": "'", 'L"': '"', 'R"': '"', "--": "-"}
# \f font, \(xx \[name] special characters, \*x \*(xx \*[name] strings, \s size, \X any other.
_ESCAPES = re.compile(r"\\f(?:\[[^\]]*\]|\(..|.)|\\\*?\((..)|\\\*?\[([^\]]*)\]"
                      r"|\\\*(.)|\\s[-+]?\d+|\\(.)")
_COMMENT = re.compile(r'\\".*')
_SINGLE = {"-": "-", "e": "\\", " ": " ", "~": " ", "0": " ", "'": "'", "`": "`", ".": "."}


def _escape(match: re.Match) -> str:
    named = next((g for g in match.groups()[:3] if g is not None), None)
    if named is not None:
        return _SPECIAL.get(named, "")
    single = match.group(4)
    return _SINGLE.get(single, "") if single is not None else ""


def _arguments(line: str) -> str:
    """The arguments of a request line, as text (quotes dropped)."""
    parts = line.split(None, 1)
    return parts[1].replace('"', "") if len(parts) > 1 else ""


def roff_to_text(source: str) -> str:
    """A manual page's prose from its roff `source` (man or mdoc): running text and headings
    in paragraphs separated by blank lines; comments, macro definitions, other requests and
    verbatim blocks left out. Empty for a page that is only `.so`."""
    paragraphs, current, skip_until = [], [], None
    for line in source.replace("\\\n", "").splitlines():
        line = _COMMENT.sub("", line)
        if skip_until is not None:
            if line.rstrip() == skip_until or line.startswith("." + skip_until):
                skip_until = None
            continue
        if line.startswith((".", "'")):
            name = (line[1:].split() or [""])[0]
            if name in ("de", "ig", "am"):
                skip_until = ".."
            elif name in _VERBATIM:
                skip_until = "." + _VERBATIM[name]
            elif name in _BREAKS:  # (an empty paragraph is dropped at the end)
                paragraphs.append(" ".join(current))
                current = [_arguments(line)] if name in ("SH", "SS", "Sh", "Ss") else []
                if name in ("IP", "TP", "It") and _arguments(line):
                    current.append(_arguments(line).split()[0])
            elif name in _INLINE:
                current.append(_arguments(line))
            continue
        if not line.strip():
            paragraphs.append(" ".join(current))
            current = []
            continue
        current.append(line)
    paragraphs.append(" ".join(current))
    cleaned = (" ".join(_ESCAPES.sub(_escape, p).split()) for p in paragraphs)
    return "\n\n".join(p for p in cleaned if p)


def installed_sources(status_path: str = DPKG_STATUS) -> dict[str, str]:
    """{installed binary package: its source package}, from dpkg's status file (if any)."""
    sources, package = {}, None
    if not os.path.exists(status_path):
        return sources
    with open(status_path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.startswith("Package: "):
                package = line.split()[1]
                sources[package] = package
            elif line.startswith("Source: ") and package:
                sources[package] = line.split()[1]
    return sources


def page_owners(info_folder: str = DPKG_INFO) -> dict[str, str]:
    """{installed file path: the binary package that installed it}, from dpkg's lists."""
    owners = {}
    for listing in glob.glob(os.path.join(info_folder, "*.list")):
        package = os.path.basename(listing)[:-len(".list")].split(":")[0]
        with open(listing, encoding="utf-8", errors="replace") as f:
            for line in f:
                if "/man/man" in line:
                    owners[line.strip()] = package
    return owners


def write_manpage_corpus(folder: str, hold_out_sources: Iterable[str] = (),
                         max_characters: int = 0, root: str = MAN_ROOT,
                         owners: dict[str, str] | None = None,
                         sources: dict[str, str] | None = None) -> dict[str, int]:
    """Writes the manual pages' prose as `man.<page>.txt` files, for LM pretraining.

    Args:
        folder: Output folder.
        hold_out_sources: Source packages whose pages are not written (a labelled task's).
        max_characters: Stop once this many characters are written (0: no limit).
        root: The manual's root (its `man1`-`man8` are read).
        owners, sources: `page_owners()` and `installed_sources()` by default.

    Returns:
        `{"pages", "characters"}` written and the pages left out as `"held_out"`,
        `"generated"` or `"includes"` (only an include, or no prose).
    """
    owners = page_owners() if owners is None else owners
    sources = installed_sources() if sources is None else sources
    held, generated = set(hold_out_sources), set(GENERATED_PACKAGES)
    counts = {"pages": 0, "characters": 0, "held_out": 0, "generated": 0, "includes": 0}
    os.makedirs(folder, exist_ok=True)
    pages = [p for p in glob.glob(os.path.join(root, "man[1-8]", "*"))  # English ones
             if os.path.isfile(p) and not os.path.islink(p)]
    # in the order of their names' SHA-256: a fixed sample when cut short
    for path in sorted(pages, key=lambda p: hashlib.sha256(os.path.basename(p).encode()).digest()):
        if max_characters and counts["characters"] >= max_characters:
            break
        package = owners.get(path, "")
        if package in generated:
            counts["generated"] += 1
            continue
        if package and sources.get(package, package) in held:
            counts["held_out"] += 1
            continue
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8", errors="replace") as f:
            text = roff_to_text(f.read())
        if not text:
            counts["includes"] += 1
            continue
        name = os.path.basename(path).removesuffix(".gz")
        with open(os.path.join(folder, f"man.{name}.txt"), "w", encoding="utf-8") as out:
            out.write(text + "\n")
        counts["pages"] += 1
        counts["characters"] += len(text)
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.datamakers.manpage_corpus",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("output", help="folder to write the .txt files to")
    parser.add_argument("--max-characters", type=int, default=0, help="0: every page")
    args = parser.parse_args(argv)
    print(f"{args.output}: {write_manpage_corpus(args.output, max_characters=args.max_characters)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
