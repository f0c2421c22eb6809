#!/usr/bin/env python3
"""Writes lib/tokenizer/unicode_tables.cpp: the Unicode data that makes dstrain's byte-level BPE
tokenizer give the same ids as Hugging Face `tokenizers` 0.23.3 (docs/tokenizers.md).

The reference uses two Unicode versions at once, and so do the tables:

- Split regex classes (\\p{L}, \\p{N}, \\s, ... : Oniguruma 6.9.10 through the `onig` crate) follow
  Unicode 16.0. Written here: the code point ranges of every two-letter General_Category value and
  of White_Space, from `unicodedata2` 16.0.0. White_Space is not in unicodedata; it is Zs, Zl, Zp
  plus U+0009..U+000D and U+0085 (PropList.txt since Unicode 6.3, when U+180E left it).
- NFC (the `unicode-normalization-alignments` 0.1.12 crate) follows Unicode 9.0: characters added
  later have combining class 0, no decomposition and no composition there. Written here: combining
  classes, canonical decompositions and primary compositions of the characters assigned by Unicode
  9.0 (their normalization data has not changed since, by Unicode's stability policy), taken from
  `unicodedata2` and filtered by DerivedAge.txt.

Both versions were found by sweeping every code point through the reference
(tests/reference/test_tokenizers.py checks them on every run).

Needs: the PyPI package unicodedata2==16.0.0 and a DerivedAge.txt (Debian's package `unicode-data`
installs one in /usr/share/unicode). For example:

    python3 -m venv /tmp/ucd && /tmp/ucd/bin/pip install unicodedata2==16.0.0
    apt-get install unicode-data
    /tmp/ucd/bin/python scripts/gen-unicode-tables.py
"""
import argparse
import os
import sys

import unicodedata2 as ucd

REGEX_UNICODE = "16.0.0"
NFC_UNICODE = (9, 0)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCALARS = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
CATEGORIES = ["Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl", "No", "Pc", "Pd", "Ps",
              "Pe", "Pi", "Pf", "Po", "Sm", "Sc", "Sk", "So", "Zs", "Zl", "Zp", "Cc", "Cf", "Co",
              "Cn"]  # Cs (the surrogates) is left out: well-formed UTF-8 never holds one
HANGUL_V = range(0x1161, 0x1176)
HANGUL_T = range(0x11A8, 0x11C3)


def read_ages(path):
    """{code point: (major, minor)} of every assigned code point."""
    ages = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.split("#")[0].strip()
            if not line:
                continue
            cps, version = (field.strip() for field in line.split(";"))
            first, _, last = cps.partition("..")
            age = tuple(int(x) for x in version.split("."))
            for c in range(int(first, 16), int(last or first, 16) + 1):
                ages[c] = age
    return ages


def to_ranges(code_points):
    ranges = []
    for c in sorted(code_points):
        if ranges and ranges[-1][1] == c - 1:
            ranges[-1][1] = c
        else:
            ranges.append([c, c])
    return ranges


def regex_tables():
    by_category = {name: [] for name in CATEGORIES}
    for c in SCALARS:
        category = ucd.category(chr(c))
        if category in by_category:
            by_category[category].append(c)
    white_space = [c for c in SCALARS
                   if ucd.category(chr(c)) in ("Zs", "Zl", "Zp") or 0x9 <= c <= 0xD or c == 0x85]
    return {name: to_ranges(cps) for name, cps in by_category.items()}, to_ranges(white_space)


def nfc_tables(ages):
    """Combining classes, one-level canonical decompositions, primary compositions and the
    code points whose NFC quick check is not Yes, all as of Unicode 9.0."""
    known = [c for c in SCALARS if ages.get(c, (99, 0)) <= NFC_UNICODE]
    ccc = [(c, ucd.combining(chr(c))) for c in known if ucd.combining(chr(c))]
    decompositions, compositions, not_yes = [], [], set()
    for c in known:
        mapping = ucd.decomposition(chr(c))
        if not mapping or mapping.startswith("<"):
            continue  # none, or a compatibility mapping (NFKC only)
        parts = [int(x, 16) for x in mapping.split()]
        decompositions.append((c, parts[0], parts[1] if len(parts) > 1 else 0))
        if len(parts) == 2 and ucd.normalize("NFC", chr(c)) == chr(c):
            compositions.append((parts[0], parts[1], c))
        else:
            not_yes.add(c)  # NFC_Quick_Check=No: never survives NFC
    not_yes.update(second for _, second, _ in compositions)  # Maybe: may join the previous one
    not_yes.update(HANGUL_V)
    not_yes.update(HANGUL_T)
    compositions.sort()
    return ccc, decompositions, compositions, to_ranges(not_yes)


def hexes(values):
    return ", ".join(f"0x{v:X}" for v in values)


def array(out, ctype, name, rows):
    """`const ctype name[] = {rows};` plus `const size_t nameCount`, rows given as tuples."""
    out.append(f"const {ctype} {name}[] = {{")
    line = "   "
    for row in rows:
        item = " {" + hexes(row) + "},"
        if len(line) + len(item) > 100:
            out.append(line)
            line = "   "
        line += item
    if rows:
        out.append(line)
    out.append("};")
    out.append(f"const size_t {name}Count = {len(rows)};")
    out.append("")


def render(categories, white_space, ccc, decompositions, compositions, not_yes):
    out = ["// Generated by scripts/gen-unicode-tables.py; do not edit. Regex classes: Unicode "
           f"{REGEX_UNICODE};",
           f"// NFC: Unicode {NFC_UNICODE[0]}.{NFC_UNICODE[1]} (see unicode_tables.h for why).",
           "// clang-format off",
           '#include "tokenizer/unicode_tables.h"',
           "",
           "namespace dstrain::tokenizer::unicode {",
           "namespace {",
           ""]
    for name in CATEGORIES:
        array(out, "Range", f"k{name}", categories[name])
    out.append("}  // namespace")
    out.append("")
    out.append("const NamedRanges kGeneralCategories[] = {")
    for name in CATEGORIES:
        out.append(f'    {{"{name}", {{k{name}, k{name}Count}}}},')
    out.append("};")
    out.append(f"const size_t kGeneralCategoriesCount = {len(CATEGORIES)};")
    out.append("")
    array(out, "Range", "kWhiteSpace", white_space)
    array(out, "CombiningClass", "kCombiningClasses", ccc)
    array(out, "Decomposition", "kDecompositions", decompositions)
    array(out, "Composition", "kCompositions", compositions)
    array(out, "Range", "kNfcQuickCheckNotYes", not_yes)
    out.append("}  // namespace dstrain::tokenizer::unicode")
    return "\n".join(out) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--derived-age", default="/usr/share/unicode/DerivedAge.txt")
    parser.add_argument("--output", default=os.path.join(REPO, "lib/tokenizer/unicode_tables.cpp"))
    args = parser.parse_args()
    if ucd.unidata_version != REGEX_UNICODE:
        sys.exit(f"unicodedata2 has Unicode {ucd.unidata_version}; need {REGEX_UNICODE} "
                 f"(pip install unicodedata2=={REGEX_UNICODE})")
    if not os.path.exists(args.derived_age):
        sys.exit(f"{args.derived_age}: no such file (apt-get install unicode-data, or "
                 "--derived-age PATH)")
    categories, white_space = regex_tables()
    text = render(categories, white_space, *nfc_tables(read_ages(args.derived_age)))
    with open(args.output, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {args.output} ({len(text)} bytes)")


if __name__ == "__main__":
    main()
