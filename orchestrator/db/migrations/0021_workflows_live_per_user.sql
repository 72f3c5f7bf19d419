-- A user's live (pending or running) workflows, counted under their creation lock on every
-- create and every spawn (WorkflowStore.check_live_room, workflow_max_live_per_user; issue
-- 29). workflows_user would read every workflow the user ever had, finished ones included,
-- while holding that lock: this index holds only the live ones.
CREATE INDEX workflows_live_user ON workflows (user_uuid) WHERE status IN ('pending', 'running');
