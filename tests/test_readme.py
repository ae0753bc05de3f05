"""The README stays true to the code: its config reference names every validator setting, and its commands exist."""

import re
from pathlib import Path

import click
import typer

from node.cli import app
from node.validator.config import ValidatorConfig

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def test_the_config_reference_lists_every_validator_setting_and_no_other():
    section = README.split("#### Validator configuration reference", 1)[1].split("\n#", 1)[0]
    listed = set(re.findall(r"^\| `([a-z_0-9]+)` \|", section, flags=re.M))
    assert listed == set(ValidatorConfig.model_fields), listed ^ set(ValidatorConfig.model_fields)


def test_every_verinfer_command_in_the_readme_code_blocks_exists():
    root = typer.main.get_command(app)
    blocks = re.findall(r"```bash\n(.*?)```", README, flags=re.S)
    used = [m.split() for block in blocks for m in re.findall(r"(?:^|[ /])verinfer ([a-z][a-z-]*(?: [a-z][a-z-]*)?)",
                                                             block, flags=re.M)]
    assert len(used) >= 10
    for words in used:
        command = root.commands.get(words[0])  # type: ignore[attr-defined]
        assert command is not None, f"verinfer {words[0]}: no such command"
        if isinstance(command, click.Group):
            assert len(words) == 2 and words[1] in command.commands, f"verinfer {' '.join(words)}: no such command"
