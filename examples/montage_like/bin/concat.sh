#!/bin/sh
# Montage-like consumer (stands in for mConcatFit): one output from every *.fits input in the
# job's directory, in name order. Usage: concat.sh OUTPUT
set -e
out=$1
find . -maxdepth 1 -name '*.fits' | sort | while read -r f; do cat "$f"; done > "$out.tmp"
mv "$out.tmp" "$out"
