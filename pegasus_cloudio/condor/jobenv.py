"""The job's ``environment``, read from the job ad the starter hands every plugin.

HTCondor passes a plugin the job's ``<PLUGIN>_*`` environment variables only from 24.3 on
(HTCONDOR-2674); 23.x and the 24.0 LTS series pass none. Every version since 8.x sets
``_CONDOR_JOB_AD`` to the job ad (old format), which carries the job's ``environment``
submit command as ``Environment`` (HTCondor's V2 syntax: whitespace-separated
``NAME=value`` words, single quotes group, ``''`` is a quote) or, from old submit files,
as ``Env`` (V1: ``NAME=value`` separated by ``;``). Reading it here makes
``environment = "CLOUDIO_PEGASUS_CREDENTIALS=creds.conf"`` work on every version.

The job ad is the job owner's own file (the job may replace it in its sandbox); nothing
read from it is logged.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple

from pegasus_cloudio.condor.ads import classad
from transfer.named_files import NO_LINKS, read_file

JOB_AD_VAR = "_CONDOR_JOB_AD"
MAX_JOB_AD_BYTES = 16 << 20  # a job ad is kilobytes; the job may replace the file with anything


class JobAdError(ValueError):
    """The job ad named by ``_CONDOR_JOB_AD`` cannot be read (the message names it)."""


def job_environment(process_env: Mapping[str, str], warnings: Optional[List[str]] = None) -> Dict[str, str]:
    """The job's environment variables; {} when the plugin was not given a job ad.

    The ad is read the one safe way (:mod:`transfer.named_files`: not through a link, a
    regular file of at most :data:`MAX_JOB_AD_BYTES`); JobAdError naming it otherwise. An ad
    that does not parse (whole) adds one line naming it to ``warnings`` and gives what was read
    before the line that did not (the job's credentials would otherwise give way to the
    defaults in silence)."""
    path = process_env.get(JOB_AD_VAR)
    if not path:
        return {}
    try:
        text = read_file(path, MAX_JOB_AD_BYTES, NO_LINKS)[0].decode("utf-8")
    except (OSError, ValueError) as err:
        reason = getattr(err, "strerror", None) or str(err)
        raise JobAdError(f"cannot read the job ad {path} (named by {JOB_AD_VAR}): {reason}") from None
    ad, bad = _parse(text)
    if bad and warnings is not None:
        warnings.append(f"the job ad {path} (named by {JOB_AD_VAR}) does not parse from line {bad} on; "
                        "no job variables are taken from there")
    if "Environment" in ad and isinstance(ad.eval("Environment"), str):
        words = split_v2(ad.eval("Environment"), path)
    elif "Env" in ad and isinstance(ad.eval("Env"), str):
        words = [w for w in ad.eval("Env").split(";") if w.strip()]
    else:
        return {}
    return dict(_pair(word) for word in words if "=" in word)


def _parse(text: str) -> Tuple[Any, int]:
    """The old-syntax ClassAd in ``text`` and the number of its first line that did not parse
    (0: none). The parser stops at that line in silence and keeps what came before, so a
    line whose name is not in the ad is where it stopped."""
    module = classad()
    try:
        ad = module.parseOne(text, module.ParserType.Old)
    except (ValueError, SyntaxError, RuntimeError):
        return module.ClassAd(), 1
    parsed = {name.lower() for name in ad.keys()}
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip() and line.partition("=")[0].strip().lower() not in parsed:
            return ad, number
    return ad, 0


def _pair(word: str) -> "tuple[str, str]":
    name, _, value = word.partition("=")
    return name.strip(), value


def split_v2(text: str, path: str) -> List[str]:
    """HTCondor's V2 word splitting (``split_args``); JobAdError on an unclosed quote."""
    words: List[str] = []
    current: List[str] = []
    in_word = quoted = False
    i = 0
    while i < len(text):
        char = text[i]
        if quoted:
            if char == "'" and text[i + 1:i + 2] == "'":
                current.append("'")
                i += 1
            elif char == "'":
                quoted = False
            else:
                current.append(char)
        elif char == "'":
            quoted = in_word = True
        elif char.isspace():
            if in_word:
                words.append("".join(current))
                current, in_word = [], False
        else:
            current.append(char)
            in_word = True
        i += 1
    if quoted:
        raise JobAdError(f"the Environment of the job ad {path} has an unclosed quote")
    if in_word:
        words.append("".join(current))
    return words
