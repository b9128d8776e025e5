"""Building a version: one definition of a work unit's tasks (unit_work), the units a previous version lends
unread (unit_reuse), who runs the tasks (executors: in-process or a pool; cluster: Ray tasks), the driver that
plans, runs and publishes (local), where a task writes its shard (shard_storage), and vectors given with the
corpus (given_vectors)."""

__all__ = ["cluster", "local"]
