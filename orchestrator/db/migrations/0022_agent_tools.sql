-- Users' agent tools (issue 30): the MCP servers they register (or admins share with
-- everyone), the HTTP tools they define, and the tool policies (the global rules and each
-- user's own). Secret values (MCP header values and stdio env, HTTP tool header values) are
-- stored only as Fernet tokens of a JSON object (orchestrator/secret_box.py): a database dump
-- shows none of them. Ids are shown as `mcp-<id>` and `http-<id>`. Times are Unix ms from the
-- database's clock, so replicas on different hosts agree. A name has no `__`: it separates the
-- parts of a tool's name (`mcp__<server>__<tool>`), so it may not appear inside one.

CREATE TABLE mcp_servers (
    id          bigserial PRIMARY KEY,
    owner       text NOT NULL,                  -- the registering user's user_uuid
    name        text NOT NULL CHECK (name ~ '^[a-z0-9_-]{1,32}$' AND name !~ '__'),
    transport   text NOT NULL CHECK (transport IN ('streamable_http', 'stdio')),
    url         text,                           -- streamable_http
    headers     bytea,                          -- Fernet token of the JSON headers; NULL: none
    command     text,                           -- stdio (one of mcp_stdio_commands)
    args        jsonb NOT NULL DEFAULT '[]',
    env         bytea,                          -- Fernet token of the JSON env; NULL: none
    shared      boolean NOT NULL DEFAULT false, -- usable by every user (admins register these)
    status      text NOT NULL DEFAULT 'ready' CHECK (status IN ('ready', 'error')),
    error       text,                           -- why the last listing of its tools failed
    tools       jsonb NOT NULL DEFAULT '[]',    -- [{name, description, input_schema}]
    version     integer NOT NULL DEFAULT 1,     -- bumped by each change of how to connect
    created_at  bigint NOT NULL DEFAULT (extract(epoch FROM clock_timestamp()) * 1000)::bigint,
    updated_at  bigint NOT NULL DEFAULT (extract(epoch FROM clock_timestamp()) * 1000)::bigint,
    CHECK ((transport = 'streamable_http') = (url IS NOT NULL)),
    CHECK ((transport = 'stdio') = (command IS NOT NULL))
);
-- One name per owner among their own servers, one among the shared ones (an own server may
-- not take a shared server's name: checked when written, under a lock on the name). Both
-- also serve the per-user reads: own servers by owner, shared ones all.
CREATE UNIQUE INDEX mcp_servers_own_name ON mcp_servers (owner, name) WHERE NOT shared;
CREATE UNIQUE INDEX mcp_servers_shared_name ON mcp_servers (name) WHERE shared;

CREATE TABLE http_tools (
    id          bigserial PRIMARY KEY,
    user_uuid   text NOT NULL,
    name        text NOT NULL CHECK (name ~ '^[a-z0-9_-]{1,32}$' AND name !~ '__'),
                                                -- offered as http__<name>
    description text NOT NULL,
    parameters  jsonb NOT NULL,                 -- a JSON Schema object
    method      text NOT NULL CHECK (method IN ('GET', 'POST', 'PUT', 'PATCH', 'DELETE')),
    url         text NOT NULL,                  -- may hold {param} placeholders
    headers     bytea,                          -- Fernet token of the JSON headers; NULL: none
    created_at  bigint NOT NULL DEFAULT (extract(epoch FROM clock_timestamp()) * 1000)::bigint,
    updated_at  bigint NOT NULL DEFAULT (extract(epoch FROM clock_timestamp()) * 1000)::bigint,
    UNIQUE (user_uuid, name)                    -- also the index of a user's tools
);

CREATE TABLE tool_policies (
    scope       text PRIMARY KEY CHECK (scope = 'global' OR scope LIKE 'user:%'),  -- user:<uuid>
    rules       jsonb NOT NULL,                 -- [{tool, action}], first match wins
    updated_at  bigint NOT NULL,
    updated_by  text NOT NULL                   -- the user_uuid who set them
);
