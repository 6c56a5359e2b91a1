"""Configuration precedence: argument > environment > config file > default; secrets stay hidden."""

from __future__ import annotations

from pathlib import Path

import pytest

from pidesk.config import HostConfig
from pidesk.core.errors import PideskError


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def test_the_file_sets_model_limits_and_providers(tmp_path):
    path = write(tmp_path, '''
model = "openai/local"
approval_timeout = 60
data_dir = "%s"
[providers.openai]
base_url = "http://127.0.0.1:11434/v1"
api_key = "from-file"
[models."openai/local"]
context_limit = 8000
''' % (tmp_path / "data"))
    config = HostConfig.from_environ({"PIDESK_CONFIG": str(path)})
    assert (config.model, config.approval_timeout, config.context_limit) == ("openai/local", 60.0, 8000)
    assert config.data_dir == tmp_path / "data"
    assert config.secrets == {"OPENAI_BASE_URL": "http://127.0.0.1:11434/v1", "OPENAI_API_KEY": "from-file"}
    assert "from-file" not in repr(config)


def test_environment_overrides_the_file_and_arguments_override_both(tmp_path):
    path = write(tmp_path, 'model = "openai/a"\n[providers.openai]\napi_key = "file"\n')
    env = {"PIDESK_CONFIG": str(path), "PIDESK_MODEL": "anthropic/b", "OPENAI_API_KEY": "env",
           "PIDESK_HOME": str(tmp_path / "h")}
    config = HostConfig.from_environ(env)
    assert (config.model, config.secrets["OPENAI_API_KEY"], config.data_dir) == ("anthropic/b", "env", tmp_path / "h")
    assert HostConfig.from_environ(env, model="demo").model == "demo"


def test_no_file_means_demo_and_tools_never_see_secrets(tmp_path):
    env = {"PIDESK_CONFIG": str(tmp_path / "missing.toml"), "OPENAI_API_KEY": "sk-x", "GITHUB_TOKEN": "t",
           "PATH": "/bin", "LC_ALL": "C.UTF-8", "HOME": "/home/u", "PYTHONPATH": "/x"}
    config = HostConfig.from_environ(env)
    assert config.model == "demo"
    assert config.tool_env == {"PATH": "/bin", "LC_ALL": "C.UTF-8", "HOME": "/home/u"}


def test_a_broken_file_is_a_clear_error(tmp_path):
    path = write(tmp_path, "model = [unclosed")
    with pytest.raises(PideskError) as error:
        HostConfig.from_environ({"PIDESK_CONFIG": str(path)})
    assert str(path) in error.value.message
