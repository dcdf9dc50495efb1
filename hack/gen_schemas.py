#!/usr/bin/env python3
"""Regenerate docs/schema/inventory.schema.json from the inventory dataclasses."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from discovery.schema import inventory_json_schema

OUT = Path(__file__).resolve().parent.parent / "docs" / "schema" / "inventory.schema.json"


def main() -> None:
    OUT.write_text(json.dumps(inventory_json_schema(), indent=2) + "\n", encoding="utf-8")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
