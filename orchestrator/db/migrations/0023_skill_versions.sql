-- Every published version of a skill (issue 30): a workflow step pins a skill's version when
-- the workflow is created, and `name@<version>` asks for an older one; republishing replaces
-- the body in `skills`, so the versions are kept here, one row per publish (written in the
-- publish's transaction). A deleted skill's versions go with it. Existing skills start with
-- their current version (the bodies of older ones were not kept).

CREATE TABLE skill_versions (
    skill_id     bigint NOT NULL REFERENCES skills (id) ON DELETE CASCADE,
    version      integer NOT NULL,
    body         text NOT NULL,
    description  text NOT NULL DEFAULT '',
    published_at bigint NOT NULL,                -- Unix ms, the database's clock
    PRIMARY KEY (skill_id, version)
);

INSERT INTO skill_versions (skill_id, version, body, description, published_at)
SELECT id, version, body, description, updated_at FROM skills;
