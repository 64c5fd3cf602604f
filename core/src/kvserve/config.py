"""One validated configuration for the whole engine; every plugin choice defaults to ``auto``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ByteSize,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from kvserve.errors import ConfigError

AUTO = "auto"
NO_GENERATION_CONFIG = "vllm"
"""``generation_config`` that ignores the model's sampling defaults (vLLM's name for its own neutral ones)."""
GENERATION_CONFIG_FIELDS = ("repetition_penalty", "temperature", "top_k", "top_p", "min_p", "max_new_tokens")
"""The fields of a ``generation_config.json`` that become requests' sampling defaults (vLLM's list)."""

_Options = TypeVar("_Options", bound=BaseModel)

SERVING_MAX_DECODE_SLOWDOWN = 2.0
"""``max_decode_slowdown`` when ``auto`` and serving: a step that decodes takes at most twice a
decode-only one, so no stream stalls behind a long prompt (issue 14's p99 step under 2x the median)."""


def json_text(value: Any) -> Any:
    """A mapping field's value as given: JSON text (a ``--*-config`` flag, a ``KVSERVE_*`` variable) is
    parsed, anything else passed on; text that is not JSON is refused saying so."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError as exc:
        raise ValueError(f"not JSON: {exc}") from None


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=())


class ModelConfig(_Section):
    model: str | None = Field(None, description="HF directory or .gguf file; None: the embedded SmolLM2")
    tokenizer: str | None = Field(None, description="Tokenizer directory when it differs from the model's")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        AUTO,
        description="Weights' and activations' dtype; auto: the platform's default, or the first dtype the "
        "quantization method runs on it",
    )
    max_model_len: PositiveInt | None = Field(
        None, description="Most tokens of one sequence, prompt and output; None: the model's max_position_embeddings"
    )
    seed: int = Field(
        0, description="Seeds the platform's random generators and the sampling of requests without their own seed"
    )
    logprobs_mode: Literal["raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits"] = Field(
        "raw_logprobs",
        description="What logprobs report: the model's distribution (raw) or the one tokens are drawn from, after "
        "masks, bias, penalties, temperature and top-k/top-p/min-p (processed); as log-probabilities or logits",
    )
    logits_processors: list[Any] = Field(
        default_factory=list,
        description="Batch-level logits processors every step runs (vLLM v1's interface): registered "
        "logits_processor plugin names, 'module:Class' strings, or LogitsProcessor classes",
    )
    generation_config: str = Field(
        AUTO,
        description="Where the sampling defaults of requests that leave them unset come from (temperature, top_p, "
        "top_k, min_p, repetition_penalty; max_new_tokens caps max_tokens), as vLLM: auto: the model's "
        "generation_config.json; vllm: none (temperature 1, no top-p/top-k/min-p, no penalty); or a folder "
        "holding a generation_config.json",
    )
    override_generation_config: dict[str, float | int] = Field(
        default_factory=dict,
        description="Sampling defaults merged over generation_config's (JSON text or a mapping), e.g. "
        "'{\"temperature\": 0.5}'; keys: " + ", ".join(GENERATION_CONFIG_FIELDS),
    )

    @field_validator("generation_config")
    @classmethod
    def _generation_config_folder(cls, value: str) -> str:
        if value not in (AUTO, NO_GENERATION_CONFIG) and not (Path(value) / "generation_config.json").is_file():
            raise ValueError(f"expected auto, vllm or a folder holding a generation_config.json; {value} has none")
        return value

    _override_json_text = field_validator("override_generation_config", mode="before")(json_text)

    @field_validator("override_generation_config")
    @classmethod
    def _known_generation_fields(cls, value: dict[str, float | int]) -> dict[str, float | int]:
        unknown = sorted(set(value) - set(GENERATION_CONFIG_FIELDS))
        if unknown:
            raise ValueError(f"unknown keys {unknown}; known: {', '.join(GENERATION_CONFIG_FIELDS)}")
        return value


class CacheConfig(_Section):
    block_size: PositiveInt | Literal["auto"] = Field(
        AUTO, description="Tokens per KV cache block; auto: the attention backend's default"
    )
    num_kv_blocks: PositiveInt | None = Field(None, description="Exact block count; overrides the memory budget")
    kv_cache_memory: ByteSize | None = Field(None, description="KV cache budget, e.g. '2GiB'; None: platform's")
    kv_cache_memory_fraction: float | None = Field(
        None, gt=0, le=1, description="Share of device memory for the KV cache when no budget is set; None: platform's"
    )
    enable_prefix_caching: bool = Field(True, description="Reuse the KV of full blocks shared with earlier prompts")
    kv_cache_manager: str = Field(
        AUTO, description="Registered kv_cache_manager name; auto: the highest-priority one (paged)"
    )


class SchedulerConfig(_Section):
    scheduler: str = Field(
        AUTO,
        description="Registered scheduler name (`kvserve plugins` lists them); auto: the highest-priority one "
        "installed",
    )
    max_num_seqs: PositiveInt = Field(128, description="Most sequences running at once (in one step's batch)")
    max_n: PositiveInt = Field(
        128, description="Most completions one request may ask for (n per prompt); the server also caps n x prompts"
    )
    max_num_batched_tokens: PositiveInt = Field(2048, description="Most tokens (prompt and decode) one step runs")
    enable_chunked_prefill: bool = Field(
        True,
        description="Prefill a prompt over several steps when it does not fit one step's token budget; "
        "off: a prompt waits until it fits a step whole",
    )
    long_prefill_token_threshold: NonNegativeInt = Field(
        0,
        description="Most prompt tokens one request prefills in a step (0: no cap beyond max_num_batched_tokens); "
        "a small cap keeps a long prompt's chunks from stalling the requests that decode meanwhile",
    )
    max_decode_slowdown: float | Literal["auto"] = Field(
        AUTO,
        description="While requests decode, size the step's prefill chunks so the step takes at most this many "
        "times a decode-only step, as measured (0: off, only the token budget applies); keeps long prompts from "
        "stalling streams, at the cost of their time to first token. auto: "
        f"{SERVING_MAX_DECODE_SLOWDOWN:g} when serving (AsyncLLM, kvserve serve), off offline (LLM), as vLLM's "
        "server takes smaller steps than its LLM class",
    )

    def decode_slowdown(self) -> float:
        """``max_decode_slowdown`` as a number; ``auto`` not resolved for serving (see
        :meth:`EngineConfig.for_serving`) is offline use: 0, off."""
        return 0.0 if self.max_decode_slowdown == AUTO else float(self.max_decode_slowdown)

    @model_validator(mode="after")
    def _prefill_limits_need_chunking(self) -> SchedulerConfig:
        if self.long_prefill_token_threshold and not self.enable_chunked_prefill:
            raise ValueError(
                f"long_prefill_token_threshold={self.long_prefill_token_threshold} splits prompts into chunks: "
                "it needs enable_chunked_prefill"
            )
        slowdown = self.decode_slowdown()
        if slowdown and slowdown <= 1:
            raise ValueError(
                f"max_decode_slowdown={slowdown}: a step that decodes and prefills takes longer "
                "than one that only decodes, so the limit must be above 1 (or 0: off)"
            )
        if slowdown and not self.enable_chunked_prefill:
            raise ValueError(
                f"max_decode_slowdown={slowdown} splits prompts into chunks: it needs enable_chunked_prefill"
            )
        return self


class AttentionConfig(_Section):
    attention_backend: str = Field(
        AUTO,
        description="Registered attention_backend name; auto: the first, the platform's preferences first, that "
        "runs on its device and accepts the model",
    )


class CompilationConfig(_Section):
    """How the model's forward runs: eagerly, or compiled by ``torch.compile`` (inductor)."""

    # An int range, not Literal[0, 1, 2]: `--set optimization_level=1` and KVSERVE_* give strings.
    optimization_level: int = Field(
        0,
        ge=0,
        le=2,
        description="0: eager (quick start); 1: torch.compile, one graph per decode-sized token bucket "
        "(larger steps eager); 2: as 1 with inductor freezing (weights folded and prepacked for the GEMM libraries)",
    )
    compile_cache_dir: str | None = Field(
        None, description="Inductor's on-disk cache; None: $TORCHINDUCTOR_CACHE_DIR, else ~/.cache/kvserve/inductor"
    )


class PlatformConfig(_Section):
    platform: str = Field(
        AUTO,
        description="Registered platform name (`kvserve plugins` lists them); auto: the highest-priority one that "
        "can run here and that an installed attention backend runs on",
    )


class QuantizationConfig(_Section):
    quantization: str = Field(AUTO, description="auto: from the checkpoint's quantization_config")


class ParallelConfig(_Section):
    tensor_parallel_size: PositiveInt = Field(1, description="ranks sharing each layer; above 1, a worker process each")
    distributed_executor_backend: Literal["auto", "mp", "ray"] = Field(
        AUTO, description="how tensor-parallel workers run: mp (processes on this machine; auto picks it), ray"
    )


class LoRAConfig(_Section):
    """Multi-LoRA: PEFT adapters run beside the base model, any mix of them in one batch (docs/lora.md)."""

    enable_lora: bool = Field(
        False, description="Serve LoRA adapters (requests name theirs: lora_request, or the model)"
    )
    max_lora_rank: PositiveInt = Field(16, description="Largest adapter rank r accepted; slots are sized for it")
    max_loras: PositiveInt = Field(
        1, description="Adapter slots: most distinct adapters running at once (others wait their turn)"
    )
    max_cpu_loras: PositiveInt | None = Field(
        None,
        description="Most adapters kept loaded in host memory that no request uses (least recently used leave "
        "first); None: max_loras",
    )

    @field_validator("max_cpu_loras")
    @classmethod
    def _cache_holds_the_slots(cls, value: int | None, info: ValidationInfo) -> int | None:
        max_loras = info.data.get("max_loras", 1)
        if value is not None and value < max_loras:
            raise ValueError(f"must be at least max_loras ({max_loras}), as vLLM requires")
        return value

    def cached_adapters(self) -> int:
        """``max_cpu_loras`` resolved: at least ``max_loras``."""
        return self.max_cpu_loras or self.max_loras


class LoRAModule(BaseModel):
    """One adapter the server serves under its own model name (``--lora-modules``)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    path: str = Field(min_length=1)
    base_model_name: str | None = None


class StructuredOutputsConfig(_Section):
    """How constrained requests (``SamplingParams.structured_outputs``, ``response_format``) are compiled."""

    backend: str = Field(
        AUTO,
        description="Registered structured_output_backend name; auto: the installed ones by priority, falling back "
        "per request to the next for a constraint one cannot compile",
    )
    disable_fallback: bool = Field(False, description="With auto: refuse what the first backend cannot compile")
    disable_any_whitespace: bool = Field(
        False, description="JSON without free whitespace (small models loop on whitespace otherwise)"
    )
    disable_additional_properties: bool = Field(
        False, description="JSON objects hold only the schema's properties unless it allows more explicitly"
    )


class SpeculativeConfig(_Section):
    """Speculative decoding, with vLLM's field names: a proposer guesses tokens, one forward pass
    verifies them, and outputs stay exactly those of decoding without it.

    Fields not declared here belong to the method: its proposer declares them
    (``DraftProposer.options``) and :meth:`method_options` checks them when the engine loads it."""

    # The method's own fields pass through, kept in model_extra, until its proposer is known.
    model_config = ConfigDict(extra="allow", validate_assignment=True, protected_namespaces=())

    method: str = Field(description="Registered draft proposer name (ngram)")
    num_speculative_tokens: PositiveInt = Field(description="Most draft tokens verified per request and step")
    prompt_lookup_max: PositiveInt | None = Field(
        None, description="ngram: longest suffix n-gram looked up in the request's tokens; None: prompt_lookup_min or 5"
    )
    prompt_lookup_min: PositiveInt | None = Field(
        None, description="ngram: shortest suffix n-gram looked up; None: prompt_lookup_max or 5"
    )
    disable_by_batch_size: int | None = Field(
        None, ge=2, description="No drafts in a step while more requests than this are running; None: never off"
    )
    adaptive_draft_length: bool = Field(
        True,
        description="Verify, of each request's drafts, only as many as raise the step's expected tokens/s "
        "(from recent step costs and the request's acceptance); false: every draft proposed",
    )

    @model_validator(mode="wrap")
    @classmethod
    def _unknown_fields_named_with_other_problems(cls, data: Any, handler: Any) -> SpeculativeConfig:
        # The method's own fields are checked once its proposer is loaded; while the core's fields are
        # wrong, a field nobody declares is likelier a misspelling of one (num_spec_tokens): name it too.
        try:
            return handler(data)
        except ValidationError as exc:
            unknown = sorted(set(data) - set(cls.model_fields)) if isinstance(data, dict) else []
            if not unknown:
                raise
            problems = [{k: e[k] for k in ("type", "loc", "input", "ctx") if k in e} for e in exc.errors()]
            problems += [{"type": "extra_forbidden", "loc": (name,), "input": data[name]} for name in unknown]
            raise ValidationError.from_exception_data(exc.title, problems) from None

    @model_validator(mode="after")
    def _lookup_bounds(self) -> SpeculativeConfig:
        # vLLM's defaults: one bound given sets the other; neither, both 5.
        low, high = self.prompt_lookup_min, self.prompt_lookup_max
        low, high = low or high or 5, high or low or 5
        if low > high:
            raise ValueError(f"prompt_lookup_min ({low}) must not exceed prompt_lookup_max ({high})")
        # Set through __dict__: a validated assignment would run this validator again.
        self.__dict__.update(prompt_lookup_min=low, prompt_lookup_max=high)
        return self

    def method_options(self, schema: type[_Options] | None) -> _Options | None:
        """The fields beyond those declared here, validated by ``schema`` (the proposer's
        ``options``; None: the method takes none). ConfigError naming each unknown or bad field."""
        given = dict(self.model_extra or {})
        where = "decoding.speculative_config"
        unknown = sorted(set(given) - set(schema.model_fields if schema else ()))
        if unknown:
            raise ConfigError(
                "invalid engine config: "
                + "; ".join(f"{where}.{name}: Extra inputs are not permitted (got {given[name]!r})" for name in unknown)
                + f" (method {self.method!r} takes {', '.join(schema.model_fields) if schema else 'no other fields'})"
            )
        if schema is None:
            return None
        try:
            return schema.model_validate(given)
        except ValidationError as exc:
            raise ConfigError(_describe(exc, where)) from None


class DecodingConfig(_Section):
    structured_outputs_config: StructuredOutputsConfig = Field(
        default_factory=StructuredOutputsConfig,
        description="Structured outputs (JSON text or a mapping): backend, disable_fallback, "
        "disable_any_whitespace, disable_additional_properties",
    )
    speculative_config: SpeculativeConfig | None = Field(
        None,
        description="Speculative decoding (JSON text or a mapping): method, num_speculative_tokens, "
        "prompt_lookup_max, prompt_lookup_min, disable_by_batch_size, and the method's own fields "
        "(docs/spec_decode.md); None: off",
    )

    _json_text = field_validator("structured_outputs_config", "speculative_config", mode="before")(json_text)


class ServerConfig(_Section):
    """The OpenAI-compatible HTTP server (``kvserve serve``); of it the engine reads only
    ``reasoning_parser`` (a structured-output grammar holds after the reasoning)."""

    host: str = Field("127.0.0.1", description="Interface to bind; loopback only unless set")
    port: int = Field(8000, ge=0, le=65535, description="0: any free port")
    api_key: SecretStr | None = Field(
        None, description="When set, requests need 'Authorization: Bearer <key>'; empty: no key needed"
    )
    served_model_name: str | None = Field(None, description="The model name clients use; None: from the model")
    max_concurrent_sequences: PositiveInt = Field(
        256, description="Sequences (n x prompts, over all generation requests) in flight; a request over it gets 429"
    )
    max_sequences_per_request: PositiveInt = Field(64, description="n x prompts of one request; more is a 400")
    max_stop_strings: PositiveInt = Field(32, description="Entries of 'stop' in one request; more is a 400")
    max_stop_string_length: PositiveInt = Field(1024, description="Characters of one 'stop' string; longer is a 400")
    max_bad_words: PositiveInt = Field(128, description="Entries of 'bad_words' in one request; more is a 400")
    max_bad_word_length: PositiveInt = Field(256, description="Characters of one 'bad_words' entry; longer is a 400")
    max_request_body_bytes: ByteSize = Field(ByteSize(2 * 1024 * 1024), gt=0, description="Larger bodies get 413")
    shutdown_timeout: PositiveFloat = Field(30.0, description="Seconds in-flight requests get to finish on shutdown")
    engine_process: bool = Field(
        False,
        description="Run the engine core (scheduler, KV cache, model) in its own process behind ZeroMQ, so "
        "HTTP, tokenization and SSE never take the GIL from the step loop",
    )
    chat_template: str | None = Field(
        None, description="A Jinja chat template, or a file holding one, used instead of the tokenizer's"
    )
    enable_auto_tool_choice: bool = Field(
        False,
        description="Let the model decide whether to call tools (tool_choice 'auto', the default with tools); "
        "needs tool_call_parser",
    )
    tool_call_parser: str | None = Field(
        None, description="Registered tool_parser that reads the calls of tool_choice 'auto' (e.g. hermes)"
    )
    tool_parser_plugin: str | None = Field(
        None, description="A Python file whose ToolParser subclasses are registered under their names"
    )
    reasoning_parser: str | None = Field(
        None,
        description="Registered reasoning_parser name (`kvserve plugins` lists them): chat answers carry the model's "
        "reasoning as reasoning_content apart from content; None: off",
    )
    lora_modules: list[LoRAModule] = Field(
        default_factory=list,
        description="LoRA adapters served as models of their own (needs enable_lora): 'name=path' or JSON "
        '\'{"name": ..., "path": ..., "base_model_name": ...}\' entries; a request\'s model field picks one',
    )

    allow_runtime_lora_updating: bool = Field(
        False,
        description="Serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter, and look up an unknown model "
        "name with the lora_resolver plugins (needs enable_lora)",
    )
    lora_resolver_cache_dir: str | None = Field(
        None,
        description="The folder the built-in filesystem lora_resolver looks in: each subfolder a PEFT adapter, "
        "named as requests name it; None: that resolver finds nothing",
    )

    @field_validator("lora_modules", mode="before")
    @classmethod
    def _lora_module_forms(cls, value: Any) -> Any:
        # --lora-modules sql=/adapters/sql '{"name": "chat", "path": "/adapters/chat"}', as vLLM takes them.
        if isinstance(value, str):
            value = json.loads(value) if value.lstrip().startswith("[") else [value]
        return [_lora_module(item) if isinstance(item, str) else item for item in value]

    @field_validator("lora_modules")
    @classmethod
    def _lora_names_unique(cls, value: list[LoRAModule]) -> list[LoRAModule]:
        names = [module.name for module in value]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"adapter names {duplicates} are given more than once")
        return value

    @field_validator("api_key", mode="before")
    @classmethod
    def _empty_key_is_no_key(cls, value: Any) -> Any:
        # KVSERVE_API_KEY= (set but empty) must not turn auth on with an empty key.
        secret = value.get_secret_value() if isinstance(value, SecretStr) else value
        return None if isinstance(secret, str) and not secret.strip() else value

    @model_validator(mode="after")
    def _auto_tool_choice_has_a_parser(self) -> ServerConfig:
        if self.enable_auto_tool_choice and self.tool_call_parser is None:
            raise ValueError("enable_auto_tool_choice needs tool_call_parser: the parser of the model's tool calls")
        return self

    @model_validator(mode="after")
    def _one_request_fits_the_server(self) -> ServerConfig:
        if self.max_sequences_per_request > self.max_concurrent_sequences:
            raise ValueError(
                f"max_sequences_per_request ({self.max_sequences_per_request}) must not exceed "
                f"max_concurrent_sequences ({self.max_concurrent_sequences}): such a request could never run"
            )
        return self


def _lora_module(text: str) -> Any:
    """``name=path`` or a JSON object, as ``--lora-modules`` entries are written."""
    if text.lstrip().startswith("{"):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{text!r} is not JSON: {exc}") from None
    name, sep, path = text.partition("=")
    if not sep:
        raise ValueError(f"{text!r}: expected name=path or a JSON object with name and path")
    return {"name": name, "path": path}


class EngineConfig(_Section):
    model: ModelConfig = Field(default_factory=ModelConfig)
    cache: CacheConfig = Field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    attention: AttentionConfig = Field(default_factory=AttentionConfig)
    compilation: CompilationConfig = Field(default_factory=CompilationConfig)
    platform: PlatformConfig = Field(default_factory=PlatformConfig)
    quantization: QuantizationConfig = Field(default_factory=QuantizationConfig)
    parallel: ParallelConfig = Field(default_factory=ParallelConfig)
    decoding: DecodingConfig = Field(default_factory=DecodingConfig)
    lora: LoRAConfig = Field(default_factory=LoRAConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)

    @model_validator(mode="after")
    def _compiled_runs_on_one_rank(self) -> EngineConfig:
        # The row layers' all-reduce inside a compiled graph is untested: refuse rather than guess.
        if self.compilation.optimization_level and self.parallel.tensor_parallel_size > 1:
            raise ValueError(
                f"optimization_level {self.compilation.optimization_level} (compiled) is not supported with "
                f"tensor_parallel_size={self.parallel.tensor_parallel_size} yet; use optimization_level 0"
            )
        return self

    @model_validator(mode="after")
    def _lora_combinations(self) -> EngineConfig:
        # LoRA runs eager steps only (docs/lora.md): compiled levels are refused, not half-built.
        if self.server.lora_modules and not self.lora.enable_lora:
            raise ValueError("lora_modules needs enable_lora")
        if self.server.allow_runtime_lora_updating and not self.lora.enable_lora:
            raise ValueError("allow_runtime_lora_updating needs enable_lora")
        if not self.lora.enable_lora:
            return self
        if self.compilation.optimization_level:
            raise ValueError(
                f"enable_lora with optimization_level {self.compilation.optimization_level} (compiled) is not "
                "supported yet; use optimization_level 0"
            )
        return self

    def for_serving(self) -> EngineConfig:
        """This config with the defaults of an engine that serves streams resolved: ``auto``
        ``max_decode_slowdown`` becomes :data:`SERVING_MAX_DECODE_SLOWDOWN` (with chunked prefill; else off)."""
        if self.scheduler.max_decode_slowdown != AUTO:
            return self
        slowdown = SERVING_MAX_DECODE_SLOWDOWN if self.scheduler.enable_chunked_prefill else 0.0
        return self.model_copy(
            update={"scheduler": self.scheduler.model_copy(update={"max_decode_slowdown": slowdown})}
        )

    @classmethod
    def from_flat(cls, **fields: Any) -> EngineConfig:
        """Build from flat field names (``LLM(max_num_seqs=8)``, CLI options, env vars).

        Every field name is unique across sections, so each maps to exactly one section.
        """
        sections: dict[str, dict[str, Any]] = {}
        for name, value in fields.items():
            section = FLAT_FIELDS.get(name)
            if section is None:
                raise ConfigError(f"unknown config field {name!r}; known fields: {', '.join(sorted(FLAT_FIELDS))}")
            sections.setdefault(section, {})[name] = value
        try:
            return cls(**sections)
        except ValidationError as exc:
            raise ConfigError(_describe(exc)) from None


def _describe(exc: ValidationError, prefix: str | None = None) -> str:
    """``scheduler.max_num_seqs: Input should be greater than 0 (got 0)`` for each problem (each
    location under ``prefix``, when the model validated is a part of the config)."""
    problems = []
    for err in exc.errors():
        parts = [str(p) for p in err["loc"] if not str(p).startswith(("function-", "literal["))]
        where = ".".join([prefix, *parts] if prefix else parts)
        problems.append(f"{where}: {err['msg']} (got {err.get('input')!r})")
    return "invalid engine config: " + "; ".join(problems)


FLAT_FIELDS: dict[str, str] = {
    name: section
    for section, info in EngineConfig.model_fields.items()
    for name in info.annotation.model_fields  # type: ignore[union-attr]
}
