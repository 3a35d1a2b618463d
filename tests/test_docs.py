"""The README and docs/ say what the code does: the README's test command is CI's, the README stays
a short map, the extending guide's dataset example runs as printed, and every relative link resolves."""
import os
import re
import sys

from helpers import fedrun

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _read(*path) -> str:
    with open(os.path.join(REPO, *path), encoding="utf-8") as f:
        return f.read()


def test_readme_is_short_and_its_test_command_is_what_ci_runs():
    readme = _read("README.md")
    assert len(readme.splitlines()) < 200
    ci = [line.strip() for line in _read(".ci", "run").splitlines() if line.strip().startswith("pip install")]
    first_block = re.search(r"```bash\n(.*?)```", readme, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in first_block.splitlines()]
    assert ci and ci[0] in commands, (ci, commands)


def test_extending_guide_dataset_and_partition_run_as_printed(tmp_path, monkeypatch):
    """docs/extending.md's dataset (one module + one yaml) and partition (one module + one yaml), written
    out verbatim in a folder outside the package and found through hydra.searchpath: `fedrun
    dataset=blobs partition=by_label` runs 2 rounds, its shared options (partition.holdout) work."""
    doc = _read("docs", "extending.md")
    section = doc.split("## Add a dataset or a partition", 1)[1].split("\n## ", 1)[0]
    for block in re.findall(r"```(?:python|yaml)\n(.*?)```", section, re.S):
        path = tmp_path / re.match(r"# (\S+\.(?:py|yaml))", block).group(1)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(block)
    monkeypatch.syspath_prepend(str(tmp_path))
    for module in ("my_dataset", "my_partition"):
        sys.modules.pop(module, None)
    r = fedrun(["dataset=blobs", "partition=by_label", "partition.holdout=2", "model=mlr", "rounds=2",
                "clients_per_round=4", "progress=false", "plot=false",
                f"hydra.searchpath=[file://{tmp_path / 'my_conf'}]",
                f"hydra.run.dir={tmp_path / 'run'}", "cache_dir=null"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "run" / "metrics.csv").read_text().count("\n") == 3  # header + 2 rounds
    import pandas as pd

    assert pd.read_csv(tmp_path / "run" / "clients.csv")["heldout"].tolist() == [0] * 6 + [1] * 2


def _anchors(text: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#+\s+(.*?)\s*$", re.sub(r"```.*?```", "", text, flags=re.S), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        seen[slug] = seen.get(slug, -1) + 1
        out.add(slug if seen[slug] == 0 else f"{slug}-{seen[slug]}")
    return out


def test_relative_links_and_anchors_in_the_docs_resolve():
    pages = ["README.md"] + [os.path.join("docs", f) for f in sorted(os.listdir(os.path.join(REPO, "docs")))
                             if f.endswith(".md")]
    broken = []
    for page in pages:
        text = re.sub(r"```.*?```", "", _read(page), flags=re.S)
        for link in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", link):
                continue
            path, _, anchor = link.partition("#")
            target = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
            if not os.path.exists(os.path.join(REPO, target)):
                broken.append(f"{page}: {link} (no file)")
            elif anchor and target.endswith(".md") and anchor not in _anchors(_read(target)):
                broken.append(f"{page}: {link} (no heading)")
    assert not broken, broken


def _write_example(tmp_path, monkeypatch, section: str) -> tuple[str, str]:
    """The section's python and yaml blocks written out verbatim under tmp_path, the module importable;
    returns (module name, config folder)."""
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    yaml = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    module = re.match(r"# (\w+)\.py", code).group(1)
    conf = re.match(r"# (\S+\.yaml)", yaml).group(1)
    (tmp_path / f"{module}.py").write_text(code)
    (tmp_path / conf).parent.mkdir(parents=True)
    (tmp_path / conf).write_text(yaml)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop(module, None)
    return module, str(tmp_path / conf.split("/")[0])


def test_extending_guide_every_hook_example_runs_and_its_server_step_is_the_worked_one(tmp_path, monkeypatch):
    """docs/extending.md's FedAvgM (every hook) runs 2 rounds as printed, serving fine-tuned models; its
    server step on two one-number clients: mean 0.25 with weights 3:1 (0.5 uniform), velocity
    0.9 * 0.5 + (1 - 0.25) = 1.2, w = 1 - 0.5 * 1.2 = 0.4."""
    import importlib

    import pandas as pd
    import torch

    from fedrun.algorithms.base import ModelLocal

    doc = _read("docs", "extending.md")
    section = doc.split("### Every hook", 1)[1].split("\n## ", 1)[0]
    module, conf = _write_example(tmp_path, monkeypatch, section)
    r = fedrun(["algo=fedavgm", "data.num_clients=5", "data.seed=35", "clients_per_round=3", "rounds=2",
                "progress=false",
                "plot=false", f"hydra.searchpath=[file://{conf}]", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert r.returncode == 0, r.stderr
    metrics = pd.read_csv(tmp_path / "run" / "metrics.csv")
    assert list(metrics["round"]) == [1, 2] and metrics["pers_acc"].notna().all()

    algo = importlib.import_module(module).FedAvgM(lr=0.1, server_lr=0.5, momentum=0.9, finetune_steps=0)
    state = algo.init({"w": torch.tensor([1.0])}, num_clients=4)
    state.extra["velocity"]["w"] = torch.tensor([0.5])
    local = ModelLocal(params={"w": torch.tensor([[9.0], [0.0], [1.0]])})  # the first trained, not aggregated
    new = algo.server_update(state, local, torch.tensor([0, 2, 3]), torch.tensor([1, 2]), torch.tensor([3.0, 1.0]))
    assert (torch.allclose(new.extra["velocity"]["w"], torch.tensor([1.2]))
            and torch.allclose(new.params["w"], torch.tensor([0.4])))
    assert algo.personalize(None, new, None) == (None, None)
