-- Each local instance's server requires its own key (llama-server's --api-key, given in the
-- LLAMA_API_KEY environment variable): only the service, which reads it here, reaches the
-- instance's port. Never part of an API answer.
ALTER TABLE inference_instances ADD COLUMN api_key text;
-- Instances recorded before: a key for their next start (a server already running keeps
-- serving without one until then; the gateway's key is ignored by it).
UPDATE inference_instances
   SET api_key = replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', '');
ALTER TABLE inference_instances ALTER COLUMN api_key SET NOT NULL;
