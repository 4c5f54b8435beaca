#!/bin/sh
# Toy job: show what the plugin staged in, write two outputs.
ls -l
cat ./*.dat 2>/dev/null | wc -c > summary.txt
date > result.dat
