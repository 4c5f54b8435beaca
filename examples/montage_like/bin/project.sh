#!/bin/sh
# Montage-like producer (stands in for mProject): writes COUNT small files PREFIX_000.fits ...
# from the header file HDR. Usage: project.sh HDR PREFIX COUNT
set -e
hdr=$1 prefix=$2 count=$3
i=0
while [ "$i" -lt "$count" ]; do
    name=$(printf '%s_%03d.fits' "$prefix" "$i")
    { head -c 200 "$hdr"; printf '\n%s %s\n' "$prefix" "$i"; } > "$name"
    i=$((i + 1))
done
