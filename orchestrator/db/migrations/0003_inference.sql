-- Local inference: the registry of models and the llama-server instances serving them.

CREATE TABLE inference_models (
    name          text PRIMARY KEY,
    path          text,                          -- the GGUF file (local); NULL for Ollama's
    provider      text NOT NULL CHECK (provider IN ('local', 'ollama')),
    ctx_size      integer NOT NULL DEFAULT 0,    -- trained context window; 0 = not known
    size_bytes    bigint NOT NULL DEFAULT 0,
    discovered_at bigint NOT NULL                -- Unix ms
);

CREATE SEQUENCE inference_instance_seq;

CREATE TABLE inference_instances (
    id          text PRIMARY KEY,                -- 'inf-' || nextval('inference_instance_seq')
    model_name  text NOT NULL,
    model_path  text NOT NULL,
    host        text,                            -- IP of the node running the process
    port        integer,
    pid         integer,
    state       text NOT NULL
                CHECK (state IN ('stopped', 'starting', 'ready', 'running', 'failed')),
    ctx_size    integer NOT NULL,
    gpu_layers  integer NOT NULL,
    threads     integer NOT NULL,
    user_uuid   text NOT NULL,                   -- who started it
    error       text,
    created_at  bigint NOT NULL,                 -- Unix ms
    updated_at  bigint NOT NULL
);
-- The gateway asks for serving instances on every local chat request.
CREATE INDEX inference_instances_live ON inference_instances (state)
    WHERE state IN ('starting', 'ready', 'running');
CREATE INDEX inference_instances_user ON inference_instances (user_uuid, created_at);
CREATE INDEX inference_instances_model ON inference_instances (model_name, created_at);
