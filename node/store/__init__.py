"""The node's LevelDB store (plyvel): payload cache, cursors, slashing protection, transaction journal."""
