-- Whether an inference instance's server takes `tools` in a chat request (issue 28), read
-- from its /props (`chat_template_caps.supports_tools` and `supports_tool_calls`, as
-- llama.cpp's server reports them) when it becomes ready. NULL: it did not say (an older
-- server): tools are offered as before. The agent runtime offers a step no tools when its
-- model's server takes none, and a step that names tools for such a model is refused.
ALTER TABLE inference_instances ADD COLUMN tools boolean;
