"""The server container: the engine container's objects plus the engine loop, metrics and HTTP app."""

from pathlib import Path

from dependency_injector import containers, providers

from eyas.containers import factories
from eyas.containers.engine_container import EngineContainer
from eyas.containers.scope import BuildTrackingSingleton as Singleton
from eyas.engine.chat_template import ChatTemplate, ModelChatTemplate
from eyas.engine.config.schema import Config
from eyas.engine.errors import ConfigError
from eyas.engine.serve.app import create_app
from eyas.engine.serve.loop import EngineLoop
from eyas.engine.serve.metrics import ServerMetrics


def served_name(configured: str | None, model_path: str) -> str:
    return configured or Path(model_path).expanduser().resolve().name


def chat_template(template, model_template: ModelChatTemplate | None) -> ChatTemplate | ModelChatTemplate:
    """The checkpoint's own template when it has one and `server.chat_template.from_model`, else the formats
    (the group's fields are ChatTemplate's)."""
    formats = ChatTemplate(**vars(template))
    if model_template is not None and formats.from_model:
        return model_template  # its turn ends at the end-of-turn token: the checkpoint's eos
    return formats


def metrics_of(loop: EngineLoop) -> ServerMetrics:
    metrics = ServerMetrics(loop)
    loop.on_finished = metrics.observe
    return metrics


def required_tokenizer(tokenizer, model_path: str):
    if tokenizer is None:
        raise ConfigError(f"the server needs a tokenizer: no tokenizer.json in model.path = {model_path}")
    return tokenizer


class ServerContainer(containers.DeclarativeContainer):
    config = providers.Dependency(instance_of=Config)  # with its `server` group

    engine_container = providers.Container(EngineContainer, config=config)
    loop = Singleton(EngineLoop, engine=engine_container.engine, max_queue=config.provided.server.max_queue)
    metrics = Singleton(metrics_of, loop)
    app = Singleton(
        create_app, loop=loop, metrics=metrics, tokenizer=providers.Callable(required_tokenizer, engine_container.models.tokenizer, config.provided.model.path),
        model_name=providers.Callable(served_name, config.provided.server.served_model_name, config.provided.model.path),
        vocab_size=providers.Callable(factories.vocab_size, engine_container.models.target_model),
        context_len=engine_container.cache.max_context_len,
        defaults=engine_container.default_sampling,
        chat_template=providers.Callable(chat_template, config.provided.server.chat_template,
                                         engine_container.models.chat_template),
        api_key=config.provided.server.api_key, max_body_bytes=config.provided.server.max_body_bytes,
    )
