"""KV cache: one paged pool per model, one allocator and request table shared by all pools."""

from dependency_injector import containers, providers

from eyas.containers import factories
from eyas.containers.scope import BuildTrackingSingleton as Singleton
from eyas.engine.cache.allocator import PageAllocator
from eyas.engine.cache.manager import KVCacheManager
from eyas.engine.cache.req_to_token import ReqToTokenTable
from eyas.engine.config.schema import CacheConfig


class CacheContainer(containers.DeclarativeContainer):
    config = providers.Dependency(instance_of=CacheConfig)
    device = providers.Dependency()
    target_model = providers.Dependency()
    lookahead_tokens = providers.Dependency()  # positions a speculative step writes past the committed length

    num_pages = providers.Callable(factories.num_pages, config.provided.max_total_tokens, config.provided.page_size)
    max_context_len = Singleton(factories.max_context_len, config.provided.max_context_len, target_model)
    allocator = Singleton(PageAllocator, num_pages)
    req_to_token = Singleton(
        ReqToTokenTable, max_requests=config.provided.max_running_requests, max_context_len=max_context_len,
        lookahead_tokens=lookahead_tokens, device=device,
    )
    prefix_cache = Singleton(factories.prefix_cache, config.provided.prefix_caching, allocator, config.provided.page_size)
    manager = Singleton(KVCacheManager, allocator, req_to_token, config.provided.page_size, prefix_cache)
    target_pool = Singleton(factories.kv_pool_for, target_model, num_pages, config.provided.page_size, device)
