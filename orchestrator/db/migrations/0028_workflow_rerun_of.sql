-- Workflow overrides and re-run (issue 32). POST /workflows/{id}/rerun {from_step} creates a
-- new workflow, same spec and owner, whose steps before from_step hold the original's
-- results; rerun_of links it to the original (GET /workflows/{id} shows it). Kept when the
-- original is deleted (the id then names nothing): a plain column, not a foreign key.
ALTER TABLE workflows ADD COLUMN rerun_of text;
