"""Model specs: the one string that names a model everywhere (config files, CLI). No torch.

"tiny" / "tiny-mla" (seeded toy Llama / DeepSeek-V3), "random:<json>" (ModelConfig fields over
tiny's), "smollm2" (the default GGUF, fetched if missing), a *.gguf file or an HF directory.
"""

from __future__ import annotations

from pathlib import Path


class UnknownModelSpec(ValueError):
    def __init__(self, spec: str) -> None:
        super().__init__(f"unknown model spec {spec!r}: want tiny, tiny-mla, random:<json>, smollm2, "
                         "a .gguf file or an HF directory")
        self.spec = spec


def resolve_spec(spec: str) -> tuple[str, str | None]:
    """(kind, argument): kind is tiny | tiny-mla | random | gguf | hf; argument a path or JSON."""
    if spec in ("tiny", "tiny-mla"):
        return spec, None
    if spec.startswith("random:"):
        return "random", spec[len("random:") :]
    if spec == "smollm2":
        from shared.model.fetch import ensure_default_model

        return "gguf", str(ensure_default_model())
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return "gguf", str(path)
    if path.is_dir() and (path / "config.json").is_file():
        return "hf", str(path)
    raise UnknownModelSpec(spec)
