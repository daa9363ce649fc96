"""What ``headlab spec`` reports, from configs alone (no torch): models' heads in numbers at one
context length (a column each, or an encoder-decoder's three head sets), the bundled catalog,
and the predicted memory of a roles run; each as JSON and as the tables a person reads.

Reading a name (a catalog name, a folder, a GGUF file) is the model catalogue's business
(:func:`headlab.models.names.named_config`); the functions here take what it read.

Example:
    >>> from headlab.layout.sheet import SpecOptions, spec_json, spec_text
    >>> from headlab.models.names import named_config
    >>> data = spec_json(["gpt2"], SpecOptions(), resolve=named_config)
    >>> data["context"], data["kv_cache_bytes_per_token"]
    (1024, 36864)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from headlab.errors import ConfigError, InputError
from headlab.layout.attention import encoder_decoder_layouts, layout_from_config
from headlab.layout.catalog import catalog, find
from headlab.layout.costs import compute_encoder_decoder_spec, compute_spec
from headlab.layout.plan import plan_memory
from headlab.text import Part, human_bytes, human_count, table

#: the context length by default, unless a model takes fewer tokens
DEFAULT_CONTEXT = 8192


@dataclass(frozen=True, kw_only=True)
class NamedConfig:
    """A model's config as ``headlab spec`` reads it.

    Attributes:
        label: the name shown for it.
        config: its config.json's fields.
        dtype: its KV cache's dtype when none is asked for (the dtype the model loads in).
    """

    label: str
    config: Mapping[str, Any]
    dtype: str


@dataclass(frozen=True, kw_only=True)
class SpecOptions:
    """What ``headlab spec`` is asked, checked to go together.

    Attributes:
        context: tokens per sequence (``None``: :data:`DEFAULT_CONTEXT`, or the shortest
            context the models declare when shorter).
        dtype: the KV cache's dtype (``None``: each model's own, :attr:`NamedConfig.dtype`).
        compare: models side by side (the JSON is a list, even of one).
        listing: the bundled catalog.
        plan: ``"roles"``: the predicted memory of a roles run (needs ``context``).
        batch: with ``plan``: sequences per forward pass (``None``: 1).
        model_dtype: with ``plan``: the model's weights and activations.

    Raises:
        InputError: options that do not go together, in one line naming the flags.
    """

    context: int | None = None
    dtype: str | None = None
    compare: bool = False
    listing: bool = False
    plan: str | None = None
    batch: int | None = None
    model_dtype: str = "fp32"

    def __post_init__(self) -> None:
        if self.plan is None:
            if self.batch is not None or self.model_dtype != "fp32":
                raise InputError("--batch and --model-dtype go with --plan roles")
            return
        if self.compare or self.listing:
            raise InputError("--plan takes one model, not --compare or --list")
        if self.context is None:
            raise InputError("--plan needs --context T (tokens per sequence)")


def spec_json(
    names: Sequence[str], options: SpecOptions, *, resolve: Callable[[str], NamedConfig]
) -> Any:
    """The heads in numbers of each of ``names`` (each read by ``resolve``, in order) at one
    context length: a dict for one model, a list with ``options.compare``; an encoder-decoder,
    named alone, gets its three head sets (:func:`encoder_decoder_json`).

    Raises:
        InputError: an encoder-decoder among several models.
        ConfigError: a config without the fields a layout needs, or an unknown dtype.
    """
    if not names:
        raise InputError("spec needs a model name")
    read = []
    for name in names:
        model = resolve(name)
        pair = encoder_decoder_layouts(model.config)
        if pair is not None:
            if len(names) > 1:
                raise InputError(
                    f"{model.label} is an encoder-decoder: spec shows its three head sets on "
                    "their own, not in --compare"
                )
            return encoder_decoder_json(model, options)
        read.append((model, layout_from_config(model.config)))
    context = options.context
    if context is None:  # no cache at a length the models cannot take
        context = min([DEFAULT_CONTEXT, *(lay.max_positions or DEFAULT_CONTEXT for _, lay in read)])
    specs = [
        {
            "model": model.label,
            **compute_spec(lay, context=context, dtype=options.dtype or model.dtype).as_dict(),
        }
        for model, lay in read
    ]
    return specs if options.compare else specs[0]


def encoder_decoder_json(model: NamedConfig, options: SpecOptions) -> dict[str, Any]:
    """An encoder-decoder's head sets (encoder, decoder, cross) and their totals, for a source
    and a target of ``options.context`` tokens each (default: as :func:`spec_json`)."""
    stacks = encoder_decoder_layouts(model.config)
    if stacks is None:
        raise ConfigError(f"{model.label} is not an encoder-decoder")
    context = options.context
    if context is None:
        limits = [lay.max_positions for lay in stacks.values() if lay.max_positions]
        context = min([DEFAULT_CONTEXT, *limits])
    spec = compute_encoder_decoder_spec(stacks, context=context, dtype=options.dtype or model.dtype)
    return {"model": model.label, **spec.as_dict()}


def spec_notes(data: Any) -> list[str]:
    """A line for each model of :func:`spec_json` counted at more tokens than it takes (the
    arithmetic holds; the model cannot run it)."""
    return [
        f"{d['model']} takes at most {d['max_positions']:,} tokens; the numbers at "
        f"{d['context']:,} are what the arithmetic gives, not what it can run"
        for d in (data if isinstance(data, list) else [data])
        if "stacks" not in d and d["max_positions"] and d["context"] > d["max_positions"]
    ]


def _rows(d: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The rows of one model's (or one head set's) column, as (row name, cell)."""
    heads = f"{d['n_layers']} x {d['n_heads']}"
    if d["heads_per_layer"]:
        per_layer = d["heads_per_layer"]
        heads = f"{d['n_layers']} layers, {min(per_layer)}-{max(per_layer)} heads"
    window = "none"
    if d["sliding_window_layers"]:
        window = (
            f"{d['sliding_window_layers']} of {d['n_layers']} layers, window {d['sliding_window']}"
            f" (each caches at most {d['sliding_window']:,} tokens)"
        )
    m = d["mla"]
    latent = (
        f"kv {m['kv_lora_rank']}, q {m['q_lora_rank']}, rope {m['qk_rope_head_dim']}" if m else "-"
    )
    per_token = d["kv_cache_bytes_per_token"]
    return [
        ("layers x heads", heads),
        ("KV heads", f"{d['n_kv_heads']}  ({d['kind']})"),
        ("head width x heads", f"{d['head_dim']} x {d['n_heads']} (model width {d['d_model']})"),
        ("latent ranks (MLA)", latent),
        ("patterns per forward", f"{d['attention_patterns']:,}"),
        (
            "attention parameters",
            f"{d['attention_params']:,} ({human_count(d['attention_params'])})",
        ),
        ("KV cache per token", f"{per_token:,} B ({human_bytes(per_token)}, {d['dtype']})"),
        (f"KV cache at {d['context']:,} tokens", human_bytes(d["kv_cache_bytes"])),
        (
            f"attention FLOPs per token at {d['context']:,}",
            human_count(d["attention_flops_per_token"]),
        ),
        ("sliding window", window),
        ("longest context (config)", f"{d['max_positions']:,}" if d["max_positions"] else "-"),
    ]


def spec_text(data: Any) -> list[Part]:
    """What ``headlab spec`` prints of :func:`spec_json`: a row per quantity, a column per model
    (titled by the model when compared), the latent ranks only where a model has them."""
    if isinstance(data, dict) and "stacks" in data:
        return [_encoder_decoder_table(data)]
    specs = data if isinstance(data, list) else [data]
    columns = [_rows(d) for d in specs]
    any_mla = any(d["mla"] for d in specs)
    rows = [
        (name, *[c[i][1] for c in columns])
        for i, (name, _) in enumerate(columns[0])
        if any_mla or not name.startswith("latent")
    ]
    compared = isinstance(data, list)
    heads = [str(d["model"]) if compared else "" for d in specs]
    title = None if compared else f"{specs[0]['model']}: heads in numbers"
    return [table(("", *heads), rows, title=title, fold=range(1, len(heads) + 1))]


#: the rows of an encoder-decoder's table that add up across its head sets: row prefix, key
_TOTALS = {
    "patterns per forward": "attention_patterns",
    "attention parameters": "attention_params",
    "KV cache per token": "kv_cache_bytes_per_token",
    "KV cache at": "kv_cache_bytes",
    "attention FLOPs per token at": "attention_flops_per_token",
}


def _total(key: str, value: int) -> str:
    if "bytes" in key:
        return human_bytes(value)
    if "flops" in key:
        return human_count(value)
    return f"{value:,}"


def _encoder_decoder_table(data: Mapping[str, Any]) -> Part:
    """A column per head set (encoder, decoder, cross) and their total."""
    columns = [_rows(d) for d in data["stacks"].values()]
    rows = []
    for i, (name, _) in enumerate(columns[0]):
        if name.startswith(("latent", "sliding")):
            continue
        key = next((k for prefix, k in _TOTALS.items() if name.startswith(prefix)), None)
        total = "" if key is None else _total(key, int(data[key]))
        rows.append((name, *[c[i][1] for c in columns], total))
    return table(
        ("", "encoder", "decoder (self)", "cross", "total"),
        rows,
        title=f"{data['model']}: heads in numbers (encoder-decoder)",
        caption=f"a source and a target of {data['context']:,} tokens each; the encoder keeps "
        "no KV cache, the cross-attention keeps the source's keys and values in every decoder "
        "layer",
        fold=(1, 2, 3, 4),
    )


def catalog_json() -> list[dict[str, str]]:
    """The bundled catalog: each model's name and source."""
    return [{"name": e.name, "source": e.source} for e in catalog()]


def catalog_text(data: Sequence[Mapping[str, str]]) -> list[Part]:
    """The catalog of :func:`catalog_json` as a table, with each model's kind and heads."""
    rows = []
    for entry in data:
        lay = layout_from_config(find(entry["name"]).config)
        rows.append((entry["name"], lay.kind, f"{lay.n_layers} x {lay.n_heads}", entry["source"]))
    return [table(("name", "kind", "layers x heads", "source"), rows, title="headlab spec catalog")]


def plan_json(model: NamedConfig, options: SpecOptions) -> dict[str, Any]:
    """``--plan roles``: the predicted peaks of one forward pass of ``model`` (its full
    config.json) over ``options.batch`` sequences of ``options.context`` tokens
    (:func:`headlab.layout.plan.plan_memory`).

    Raises:
        ConfigError: an encoder-decoder (the plan is of one stack of layers: not a plan of its
            encoder alone, as T5's config reads, nor a missing-field error, as BART's).
    """

    config = model.config
    if config.get("is_encoder_decoder"):
        raise ConfigError(
            f"{model.label} is an encoder-decoder ({config.get('model_type', 'unknown')}: "
            "encoder, decoder and cross-attention heads); --plan roles plans models with one "
            "stack of layers"
        )
    if options.context is None:
        raise InputError("--plan needs --context T (tokens per sequence)")
    plan = plan_memory(
        config, context=options.context, batch=options.batch or 1, dtype=options.model_dtype
    )
    return {"model": model.label, **plan.as_dict()}


def plan_text(data: Mapping[str, Any]) -> list[Part]:
    """The plan of :func:`plan_json`: the weights, each part of each peak, each peak with the
    weights."""
    weights = data["weights_bytes"]
    rows = [("weights", human_bytes(weights))]
    for title, key in (
        ("roles (streaming)", "roles_streaming"),
        ("eager capture", "eager_capture"),
    ):
        rows += [(f"  {title}: {n}", human_bytes(v)) for n, v in data[key]["parts"].items()]
        rows.append((f"{title}: peak + weights", human_bytes(weights + data[key]["peak_bytes"])))
    title = (
        f"{data['model']}: memory of one forward over {data['batch']} x {data['context']:,} "
        f"tokens ({data['dtype']})"
    )
    return [table(("", "bytes"), rows, title=title, right=(1,))]
