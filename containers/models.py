"""Models, tokenizer and device: heavy, shared, built once (singletons)."""

from dependency_injector import containers, providers

from eyas.containers import factories
from eyas.containers.scope import BuildTrackingSingleton as Singleton
from eyas.engine.chat_template import model_chat_template
from eyas.engine.config.schema import Config
from eyas.engine.models.checkpoint_source import checkpoint_directory
from eyas.engine.models.loader import load_model


class ModelContainer(containers.DeclarativeContainer):
    config = providers.Dependency(instance_of=Config)

    device = Singleton(factories.resolve_device, config.provided.device, config.provided.num_threads)
    # model.path as a Hugging Face directory (a .gguf file's metadata directory for a GGUF file)
    checkpoint = Singleton(checkpoint_directory, config.provided.model.path)
    # model.quantization with `auto` resolved against the checkpoint and device
    quantization = Singleton(factories.model_quantization, config.provided.model.quantization, checkpoint, device)
    target_model = Singleton(
        load_model, path=checkpoint, dtype=config.provided.model.dtype,
        device=device, weight_layout=config.provided.model.weight_layout, quantization=quantization,
        quantization_group_size=config.provided.model.quantization_group_size,
    )
    tokenizer = Singleton(factories.load_tokenizer, checkpoint)
    chat_template = Singleton(model_chat_template, checkpoint)  # the checkpoint's own, or None
    eos_token_ids = Singleton(factories.eos_token_ids, target_model, tokenizer)
