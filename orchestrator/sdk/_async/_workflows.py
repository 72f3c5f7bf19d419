"""Workflows, templates, interventions, agent teams and scheduled jobs."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Literal

from orchestrator.sdk._async._core import AsyncCore, offset_pages
from orchestrator.sdk._base import Call, model_of
from orchestrator.sdk._requests import (
    ScheduleOptions,
    StepSpec,
    as_dict,
    as_list,
    given,
    idempotency,
    seg,
)
from orchestrator.wire import (
    Intervention,
    InterventionDecided,
    InterventionPage,
    Job,
    JobCreated,
    JobPage,
    JobStatus,
    SchedulePreview,
    Team,
    TemplateSaved,
    Workflow,
    WorkflowCancelled,
    WorkflowCreated,
    WorkflowDeleted,
    WorkflowOverridden,
    WorkflowPage,
    WorkflowRerun,
    WorkflowSummary,
    WorkflowTemplates,
)

__all__ = ["AsyncWorkflows"]


class AsyncWorkflows(AsyncCore):
    async def create_workflow(
        self,
        name: str | None = None,
        steps: Sequence[StepSpec] | None = None,
        *,
        template: str | None = None,
        variables: Mapping[str, Any] | None = None,
        model: str | None = None,
        idempotency_key: str | None = None,
        notify: Mapping[str, Any] | None = None,
    ) -> WorkflowCreated:
        """Inline (`name`, `steps`) or from a template; it starts at once. With
        `idempotency_key`, sending it again (also the client's own retries) answers the
        first workflow instead of creating another. `notify`: `{channel_id}`, where its
        questions to people (approval steps, tool calls under an `ask` rule) are posted."""
        body = given(
            name=name,
            steps=as_list(steps),
            template=template,
            variables=as_dict(variables),
            model=model,
            notify=as_dict(notify),
        )
        headers = idempotency(idempotency_key)
        call = Call("POST", "/workflows", model_of(WorkflowCreated), body=body, headers=headers)
        return await self._send(call)

    async def workflow(self, workflow_id: str) -> Workflow:
        return await self._send(Call("GET", f"/workflows/{seg(workflow_id)}", model_of(Workflow)))

    async def workflows(
        self,
        status: str | None = None,
        parent: str | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> WorkflowPage:
        """One page; `iter_workflows` walks them all."""
        params = given(status=status, parent=parent, limit=limit, offset=offset)
        return await self._send(Call("GET", "/workflows", model_of(WorkflowPage), params=params))

    def iter_workflows(
        self, status: str | None = None, parent: str | None = None, *, page_size: int = 100
    ) -> AsyncIterator[WorkflowSummary]:
        async def fetch(offset: int) -> list[WorkflowSummary]:
            return (await self.workflows(status, parent, page_size, offset)).data

        return offset_pages(fetch, page_size)

    async def cancel_workflow(self, workflow_id: str) -> WorkflowCancelled:
        path = f"/workflows/{seg(workflow_id)}/cancel"
        return await self._send(Call("POST", path, model_of(WorkflowCancelled)))

    async def delete_workflow(self, workflow_id: str) -> WorkflowDeleted:
        path = f"/workflows/{seg(workflow_id)}"
        return await self._send(Call("DELETE", path, model_of(WorkflowDeleted)))

    # --- overrides and re-run (issue 32) ----------------------------------------------------

    async def retry_step(
        self, workflow_id: str, step: str, reason: str | None = None
    ) -> WorkflowOverridden:
        """A new attempt of the failed step of a failed workflow (which goes on from it), or
        of the running step of a running one (its attempt in flight abandoned)."""
        path = f"/workflows/{seg(workflow_id)}/steps/{seg(step)}/retry"
        body = given(reason=reason) or None
        return await self._send(Call("POST", path, model_of(WorkflowOverridden), body=body))

    async def skip_step(
        self, workflow_id: str, step: str, reason: str | None = None
    ) -> WorkflowOverridden:
        """The failed (or running) step becomes `skipped`; the next one starts."""
        path = f"/workflows/{seg(workflow_id)}/steps/{seg(step)}/skip"
        body = given(reason=reason) or None
        return await self._send(Call("POST", path, model_of(WorkflowOverridden), body=body))

    async def resume_workflow(
        self, workflow_id: str, reason: str | None = None
    ) -> WorkflowOverridden:
        """A failed (or stuck running) workflow goes on from the step it stopped at."""
        path = f"/workflows/{seg(workflow_id)}/resume"
        body = given(reason=reason) or None
        return await self._send(Call("POST", path, model_of(WorkflowOverridden), body=body))

    async def rerun_workflow(
        self, workflow_id: str, from_step: str, reason: str | None = None
    ) -> WorkflowRerun:
        """A new workflow, same spec and owner, whose steps before `from_step` keep the
        original's results (not run again); `.id` is the new workflow's."""
        path = f"/workflows/{seg(workflow_id)}/rerun"
        body = given(from_step=from_step, reason=reason)
        call = Call("POST", path, model_of(WorkflowRerun), body=body)
        return await self._send(call)

    async def save_template(
        self, name: str, steps: Sequence[StepSpec], shared: bool = False
    ) -> TemplateSaved:
        body = {"name": name, "steps": list(steps), "shared": shared}
        call = Call("POST", "/workflows/templates", model_of(TemplateSaved), body=body)
        return await self._send(call)

    async def templates(self) -> WorkflowTemplates:
        return await self._send(Call("GET", "/workflows/templates", model_of(WorkflowTemplates)))

    # --- interventions (issue 32) ----------------------------------------------------------

    async def interventions(
        self,
        status: str | None = None,
        limit: int | None = None,
        offset: int = 0,
        *,
        workflow_id: str | None = None,
    ) -> InterventionPage:
        """One page of yours (your workflows', or yours to decide; admins: all), newest first;
        `status`: pending, approved, rejected or expired; `workflow_id`: one workflow's.
        `iter_interventions` walks them all."""
        params = given(status=status, workflow_id=workflow_id, limit=limit, offset=offset)
        call = Call("GET", "/interventions", model_of(InterventionPage), params=params)
        return await self._send(call)

    def iter_interventions(
        self, status: str | None = None, *, workflow_id: str | None = None, page_size: int = 100
    ) -> AsyncIterator[Intervention]:
        async def fetch(offset: int) -> list[Intervention]:
            page = await self.interventions(status, page_size, offset, workflow_id=workflow_id)
            return page.data

        return offset_pages(fetch, page_size)

    async def intervention(self, intervention_id: str) -> Intervention:
        path = f"/interventions/{seg(intervention_id)}"
        return await self._send(Call("GET", path, model_of(Intervention)))

    async def approve_intervention(
        self, intervention_id: str, note: str | None = None
    ) -> InterventionDecided:
        """The call runs (or the approval step completes); 409 once decided or expired."""
        path = f"/interventions/{seg(intervention_id)}/approve"
        body = given(note=note)
        return await self._send(Call("POST", path, model_of(InterventionDecided), body=body))

    async def reject_intervention(self, intervention_id: str, reason: str) -> InterventionDecided:
        """The agent is told the call was refused, with `reason` (an approval step fails)."""
        path = f"/interventions/{seg(intervention_id)}/reject"
        body = {"reason": reason}
        return await self._send(Call("POST", path, model_of(InterventionDecided), body=body))

    async def team(self, team_id: str) -> Team:
        """A coordinate step's agent team (issue 33): its members and mail log."""
        return await self._send(Call("GET", f"/teams/{seg(team_id)}", model_of(Team)))

    # --- schedules (admin) -----------------------------------------------------------------

    async def create_schedule(
        self,
        prompt: str,
        *,
        name: str | None = None,
        cron: str | None = None,
        every: int | None = None,
        at: int | None = None,
        schedule: str | None = None,
        tz: str | None = None,
        model: str | None = None,
        opts: ScheduleOptions | None = None,
        delete_after_run: bool = False,
    ) -> JobCreated:
        """One of `cron` (5 fields), `every` (ms), `at` (Unix ms) or `schedule` (a phrase)."""
        body = given(
            prompt=prompt,
            name=name,
            cron=cron,
            every=every,
            at=at,
            schedule=schedule,
            tz=tz,
            model=model,
            opts=as_dict(opts),
            delete_after_run=delete_after_run or None,
        )
        return await self._send(Call("POST", "/schedules", model_of(JobCreated), body=body))

    async def preview_schedule(
        self,
        *,
        cron: str | None = None,
        every: int | None = None,
        at: int | None = None,
        schedule: str | None = None,
        tz: str | None = None,
        count: int | None = None,
    ) -> SchedulePreview:
        """The next `count` (5) runs of a job with this schedule created now; stores nothing."""
        body = given(cron=cron, every=every, at=at, schedule=schedule, tz=tz, count=count)
        call = Call("POST", "/schedules/preview", model_of(SchedulePreview), body=body)
        return await self._send(call)

    async def schedules(self, page: int = 1, per_page: int | None = None) -> JobPage:
        """One page; `iter_schedules` walks them all."""
        params = given(page=page, per_page=per_page)
        return await self._send(Call("GET", "/schedules", model_of(JobPage), params=params))

    async def iter_schedules(self, *, page_size: int = 100) -> AsyncIterator[Job]:
        page = 1
        while True:
            found = await self.schedules(page, page_size)
            for item in found.items:
                yield item
            if len(found.items) < page_size or page * page_size >= found.total:
                return
            page += 1

    async def schedule(self, job_id: int) -> Job:
        return await self._send(Call("GET", f"/schedules/{int(job_id)}", model_of(Job)))

    async def delete_schedule(self, job_id: int) -> JobStatus:
        return await self._job_action(job_id, "delete")

    async def pause_schedule(self, job_id: int) -> JobStatus:
        return await self._job_action(job_id, "pause")

    async def unpause_schedule(self, job_id: int) -> JobStatus:
        return await self._job_action(job_id, "unpause")

    async def run_schedule(self, job_id: int) -> JobStatus:
        return await self._job_action(job_id, "run")

    async def _job_action(
        self, job_id: int, action: Literal["delete", "pause", "unpause", "run"]
    ) -> JobStatus:
        if action == "delete":
            call = Call("DELETE", f"/schedules/{int(job_id)}", model_of(JobStatus))
        else:
            call = Call("POST", f"/schedules/{int(job_id)}/{action}", model_of(JobStatus))
        return await self._send(call)
