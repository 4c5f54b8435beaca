"""The job's ``environment``, read from the job ad the starter hands every plugin.

HTCondor passes a plugin the job's ``<PLUGIN>_*`` environment variables only from 24.3 on
(HTCONDOR-2674); 23.x and the 24.0 LTS series pass none. Every version since 8.x sets
``_CONDOR_JOB_AD`` to the job ad (old format), which carries the job's ``environment``
submit command as ``Environment`` (HTCondor's V2 syntax: whitespace-separated
``NAME=value`` words, single quotes group, ``''`` is a quote) or, from old submit files,
as ``Env`` (V1: ``NAME=value`` separated by ``;``). Reading it here makes
``environment = "CLOUDIO_PEGASUS_CREDENTIALS=creds.conf"`` work on every version.

The job ad is the job owner's own file; nothing read from it is logged.
"""

from __future__ import annotations

from typing import Dict, List, Mapping

from pegasus_cloudio.condor.ads import classad

JOB_AD_VAR = "_CONDOR_JOB_AD"


class JobAdError(ValueError):
    """The job ad named by ``_CONDOR_JOB_AD`` cannot be read (the message names it)."""


def job_environment(process_env: Mapping[str, str]) -> Dict[str, str]:
    """The job's environment variables; {} when the plugin was not given a job ad."""
    path = process_env.get(JOB_AD_VAR)
    if not path:
        return {}
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except (OSError, ValueError) as err:
        reason = getattr(err, "strerror", None) or str(err)
        raise JobAdError(f"cannot read the job ad {path} (named by {JOB_AD_VAR}): {reason}") from None
    module = classad()
    ad = module.parseOne(text, module.ParserType.Old)
    if "Environment" in ad and isinstance(ad.eval("Environment"), str):
        words = split_v2(ad.eval("Environment"), path)
    elif "Env" in ad and isinstance(ad.eval("Env"), str):
        words = [w for w in ad.eval("Env").split(";") if w.strip()]
    else:
        return {}
    return dict(_pair(word) for word in words if "=" in word)


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
