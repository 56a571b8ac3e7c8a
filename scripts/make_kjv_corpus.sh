#!/usr/bin/env bash
# Regenerate src/posemb/lab/data/kjv.txt.xz, the lab's default corpus, from Debian's packages.
#
# Provenance: the King James Version (1611; public domain) as shipped by Debian's bible-kjv
# (the `bible` retrieval program, GPL-2+) and bible-kjv-text (its data file) packages, version
# 4.38 in bookworm. The text is dumped verse by verse, chapter headings and verse numbers are
# removed, and each verse becomes one line; nothing else is changed. Needs apt-get (to download
# the two packages, no install), dpkg-deb, python3 and xz.
set -euo pipefail
cd "$(dirname "$0")/.."
out=src/posemb/lab/data/kjv.txt.xz
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && apt-get download bible-kjv bible-kjv-text >/dev/null)
for deb in "$work"/*.deb; do dpkg-deb -x "$deb" "$work/root"; done
"$work/root/usr/bin/bible" -p "$work/root/usr/lib" "gen1:1-rev22:21" > "$work/raw.txt"
python3 - "$work/raw.txt" "$work/kjv.txt" <<'PY'
import re, sys
raw = open(sys.argv[1], encoding="utf-8").read().splitlines()
verses, current = [], []
for line in raw:
    if not line.strip():
        continue
    m = re.match(r"^\s+\d+ (.*)$", line)
    if m:  # a new verse: "  12 text"
        if current:
            verses.append(" ".join(current))
        current = [m.group(1).strip()]
    elif re.match(r"^[1-3]?\s?[A-Z][A-Za-z ]+ \d+$", line.strip()):  # "Genesis 1": a heading
        continue
    else:  # a verse's wrapped continuation
        current.append(line.strip())
if current:
    verses.append(" ".join(current))
open(sys.argv[2], "w", encoding="utf-8").write("\n".join(verses) + "\n")
print(f"{len(verses)} verses, {sum(map(len, verses))} characters")
PY
xz -9e -T1 --keep --stdout "$work/kjv.txt" > "$out.tmp"
mv "$out.tmp" "$out"
ls -l "$out"
