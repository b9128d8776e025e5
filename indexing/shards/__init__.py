"""A shard's formats: passages cut into content-defined shards (chunking), their stored text (store), vectors
(embed), FAISS indexes (dense, faiss_gpu: where one lives on a GPU), Lucene indexes (sparse), and the native
memory bounds of a build (native_memory)."""

__all__ = ["chunking", "dense", "embed", "faiss_gpu", "native_memory", "sparse", "store"]
