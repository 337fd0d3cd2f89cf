"""Create or update, by name, the automations in infra/automations.yaml on the Prefect server
that PREFECT_API_URL names.

`prefect automation create --from-file` adds a second copy each time it runs; this script
updates an automation that already has the name instead, so it can run on every deploy.

    PREFECT_API_URL=http://<server>:4200/api python3 infra/apply_automations.py [FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path

import httpx
import yaml
from prefect.client.orchestration import get_client
from prefect.events.schemas.automations import AutomationCore
from prefect.settings import get_current_settings

DEFAULT_FILE = Path(__file__).resolve().parent / "automations.yaml"


def load(path: Path) -> list[AutomationCore]:
    """The automations of a file, validated by Prefect's own model before anything is sent."""
    data = yaml.safe_load(path.read_text())
    return [AutomationCore.model_validate(item) for item in data["automations"]]


async def apply(automations: list[AutomationCore]) -> list[str]:
    """Create each automation, or update the one of that name; one line per automation."""
    lines = []
    async with get_client() as client:
        for automation in automations:
            existing = await client.read_automations_by_name(automation.name)
            if len(existing) > 1:
                msg = f"{len(existing)} automations named {automation.name!r}; keep one"
                raise ValueError(msg)
            if existing:
                await client.update_automation(existing[0].id, automation)
                lines.append(f"updated: {automation.name} ({existing[0].id})")
            else:
                created = await client.create_automation(automation)
                lines.append(f"created: {automation.name} ({created})")
    return lines


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", nargs="?", type=Path, default=DEFAULT_FILE)
    args = parser.parse_args(argv)
    try:
        lines = asyncio.run(apply(load(args.file)))
    except httpx.HTTPError as exc:
        print(f"apply_automations: error: {get_current_settings().api.url}: {exc}", file=sys.stderr)
        return 1
    except (OSError, ValueError, KeyError) as exc:
        print(f"apply_automations: error: {exc}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
