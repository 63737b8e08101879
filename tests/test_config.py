import pytest

from agent import config
from agent.errors import ConfigError


def test_defaults_are_complete_and_valid():
    cfg = config.load()
    assert cfg["listen"] == "0.0.0.0:9835"
    assert cfg["procfs"] == "/proc" and cfg["sysfs"] == "/sys"
    assert set(cfg["collectors"]) == set(config.COLLECTORS)
    # merging the defaults over themselves validates every default against its own field
    assert config.merge(config.defaults(), config.defaults()) == cfg


def write(tmp_path, text):
    p = tmp_path / "teye.yml"
    p.write_text(text)
    return str(p)


def test_file_overrides_defaults_and_flags_override_file(tmp_path):
    path = write(tmp_path, "listen: 127.0.0.1:1234\ncollectors:\n  cpu:\n    interval_seconds: 2\n")
    cfg = config.load(path, {"listen": "127.0.0.1:9999"})
    assert cfg["listen"] == "127.0.0.1:9999"
    assert cfg["collectors"]["cpu"]["interval_seconds"] == 2.0
    assert isinstance(cfg["collectors"]["cpu"]["interval_seconds"], float)
    assert cfg["collectors"]["memory"]["interval_seconds"] == 5.0  # untouched siblings keep defaults


@pytest.mark.parametrize("text, key, expected", [
    ("lisen: x\n", "lisen", "unknown key"),
    ("collectors:\n  cpu:\n    perod: 1\n", "collectors.cpu.perod", "unknown key"),
    ("collectors:\n  nope: {}\n", "collectors.nope", "unknown key"),
    ("collectors:\n  cpu:\n    interval_seconds: fast\n", "collectors.cpu.interval_seconds", "expected number"),
    ("collectors:\n  cpu:\n    interval_seconds: -1\n", "collectors.cpu.interval_seconds", "must be > 0"),
    ("collectors:\n  cpu:\n    enabled: 1\n", "collectors.cpu.enabled", "expected boolean"),
    ("listen: 9835\n", "listen", "expected string"),
    ("listen: localhost\n", "listen", "HOST:PORT"),
    ("disk:\n  exclude: '('\n", "disk.exclude", "regular expression"),
    ("log_level: loud\n", "log_level", "must be one of"),
    ("collectors: 3\n", "collectors", "expected a mapping"),
])
def test_bad_keys_name_the_key_and_the_type(tmp_path, text, key, expected):
    with pytest.raises(ConfigError) as e:
        config.load(write(tmp_path, text))
    msg = str(e.value)
    assert f"'{key}'" in msg and expected in msg
    assert "\n" not in msg


def test_bad_yaml_names_the_line(tmp_path):
    with pytest.raises(ConfigError) as e:
        config.load(write(tmp_path, "listen: [unclosed\n"))
    assert "invalid YAML" in str(e.value) and "line" in str(e.value)


def test_top_level_must_be_a_mapping(tmp_path):
    with pytest.raises(ConfigError, match="top level"):
        config.load(write(tmp_path, "- a\n- b\n"))


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="No such file"):
        config.load(str(tmp_path / "absent.yml"))


def test_empty_file_means_defaults(tmp_path):
    assert config.load(write(tmp_path, "")) == config.defaults()


@pytest.mark.parametrize("text, host, port", [("0.0.0.0:9835", "0.0.0.0", 9835), (":80", "0.0.0.0", 80),
                                              ("[::1]:9", "::1", 9), ("localhost:1", "localhost", 1)])
def test_split_hostport(text, host, port):
    assert config.split_hostport(text) == (host, port)
