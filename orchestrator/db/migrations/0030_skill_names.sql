-- Skill names and descriptions as clients send them (issue 33): a name is any 1-64
-- characters without control characters or `/` (mixed case, spaces, any script), checked
-- by the marketplace; the description's limit is a setting (`skill_description_max`), so
-- the table no longer fixes it. The name's CHECK keeps only what no setting may change.

ALTER TABLE skills DROP CONSTRAINT IF EXISTS skills_name_check;
ALTER TABLE skills DROP CONSTRAINT IF EXISTS skills_description_check;
ALTER TABLE skills ADD CONSTRAINT skills_name_check
    CHECK (char_length(name) BETWEEN 1 AND 64 AND name !~ '[[:cntrl:]/]');
