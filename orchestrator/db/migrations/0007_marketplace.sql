-- Marketplace (SPEC part 4 "Marketplace", part 2 skill, part 8 limits): skills unique per
-- (name, author), full-text search over name and description, moderation reports, and the
-- publish log that the hourly publish limit counts (durable, shared by every replica, and
-- still enforced while Redis is down).

CREATE TABLE skills (
    id          bigserial PRIMARY KEY,
    name        text NOT NULL CHECK (name ~ '^[a-z0-9][a-z0-9._-]{0,63}$'),
    author      text NOT NULL,                   -- the publisher's user_uuid
    description text NOT NULL DEFAULT '' CHECK (char_length(description) <= 1000),
    tags        text[] NOT NULL DEFAULT '{}' CHECK (cardinality(tags) <= 16),
    body        text NOT NULL CHECK (char_length(body) BETWEEN 1 AND 4096),
    downloads   bigint NOT NULL DEFAULT 0,
    version     integer NOT NULL DEFAULT 1,      -- bumped by each republish
    created_at  bigint NOT NULL,                 -- Unix ms, first publish
    updated_at  bigint NOT NULL,                 -- Unix ms, latest publish
    -- Name words weigh more than description words; `-`, `_` and `.` split name words.
    search      tsvector GENERATED ALWAYS AS (
                    setweight(to_tsvector('english', translate(name, '-_.', '   ')), 'A')
                    || setweight(to_tsvector('english', description), 'B')) STORED,
    UNIQUE (name, author)
);
CREATE INDEX skills_search ON skills USING gin (search);
CREATE INDEX skills_tags ON skills USING gin (tags);
CREATE INDEX skills_newest ON skills (created_at DESC, id DESC);
CREATE INDEX skills_popular ON skills (downloads DESC, created_at DESC, id DESC);

CREATE TABLE skill_reports (
    id           bigserial PRIMARY KEY,
    skill_id     bigint NOT NULL REFERENCES skills (id) ON DELETE CASCADE,
    reporter     text NOT NULL,                  -- the reporting user's user_uuid
    reason       text NOT NULL CHECK (char_length(reason) BETWEEN 1 AND 1000),
    created_at   bigint NOT NULL,
    dismissed    boolean NOT NULL DEFAULT false,
    dismissed_at bigint,
    dismissed_by text
);
-- One pending report per reporter and skill: reporting again replaces the reason.
CREATE UNIQUE INDEX skill_reports_pending_once ON skill_reports (skill_id, reporter)
    WHERE NOT dismissed;
CREATE INDEX skill_reports_pending ON skill_reports (created_at) WHERE NOT dismissed;

CREATE TABLE skill_publishes (
    author       text NOT NULL,
    name         text NOT NULL,
    version      integer NOT NULL,
    published_at bigint NOT NULL                 -- Unix ms, the database's clock
);
CREATE INDEX skill_publishes_window ON skill_publishes (author, published_at);
