"""Nothing unpickles or torch.loads untrusted files; YAML only through safe_load."""
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "autosync"
FORBIDDEN = [
    (re.compile(r"\bpickle\.loads?\("), "pickle.load"),
    (re.compile(r"\bcloudpickle\.|\bdill\.|\bjoblib\.load\("), "other unpicklers"),
    (re.compile(r"\byaml\.(load|unsafe_load|full_load)\("), "yaml.load without safe_load"),
    (re.compile(r"\bnp\.load\(.*allow_pickle\s*=\s*True"), "np.load(allow_pickle=True)"),
    (re.compile(r"\beval\(|\bexec\("), "eval/exec"),
]


def test_package_source_has_no_unsafe_deserialization():
    problems = []
    for path in PACKAGE.rglob("*.py"):
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            for pattern, what in FORBIDDEN:
                if pattern.search(code):
                    problems.append(f"{path.relative_to(PACKAGE.parent)}:{lineno}: {what}")
            if "torch.load(" in code and "weights_only=True" not in code:
                problems.append(f"{path.relative_to(PACKAGE.parent)}:{lineno}: torch.load without weights_only=True")
    assert problems == []


def test_models_are_lightgbm_text_and_json_never_pickles():
    pretrained = PACKAGE / "models" / "pretrained"
    files = {p.suffix for p in pretrained.rglob("*") if p.is_file()}
    assert files <= {".txt", ".json"}
    for model in pretrained.rglob("model.txt"):
        assert model.read_text().startswith("tree\n")
