"""The Prometheus rule files under deploy/prometheus/rules, read once for every deploy test."""
from __future__ import annotations

import glob
import os
from typing import List, Tuple

import yaml

from tests.procs import REPO

RULE_FILES = sorted(glob.glob(os.path.join(REPO, "deploy", "prometheus", "rules", "*.yml")))


def rules_with_files() -> List[Tuple[str, dict]]:
    """(rule file path, rule) for every recording and alert rule, in file order."""
    out = []
    for path in RULE_FILES:
        with open(path, encoding="utf-8") as fh:
            for group in yaml.safe_load(fh)["groups"]:
                out.extend((path, r) for r in group["rules"])
    return out


def load_rules() -> List[dict]:
    return [r for _, r in rules_with_files()]
