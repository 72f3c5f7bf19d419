"""SPEC part 4, workflows: the endpoints land with their own issue."""

from fastapi import APIRouter

router = APIRouter(tags=["workflows"])
