"""Models, tokenizer and device: heavy, shared, built once (singletons)."""

from dependency_injector import containers, providers

from eyas.containers import factories
from eyas.containers.scope import BuildTrackingSingleton as Singleton
from eyas.engine.models.loader import load_model


class ModelContainer(containers.DeclarativeContainer):
    config = providers.Configuration()

    device = Singleton(factories.resolve_device, config.device, config.num_threads)
    target_model = Singleton(
        load_model, path=config.model.path, dtype=providers.Callable(factories.model_dtype, config.model.dtype),
        device=device, weight_layout=config.model.weight_layout, quantization=config.model.quantization,
        quantization_group_size=config.model.quantization_group_size,
    )
    tokenizer = Singleton(factories.load_tokenizer, config.model.path)
    eos_token_ids = Singleton(factories.eos_token_ids, target_model, tokenizer)
