"""A failed hub request (metadata here, or a file in the download child) as the gateway error that says
why: downloads off, gated, not found, unreachable, or an internal error with an id."""
from __future__ import annotations

from gateway import errors
from gateway.hub.options import HubOptions


def explain(exc: BaseException, repo_id: str, options: HubOptions) -> errors.ApiError:
    """A huggingface_hub / requests exception as the error that says why."""
    from huggingface_hub import errors as hf_errors
    import requests

    where = options.endpoint or "https://huggingface.co"
    if isinstance(exc, hf_errors.OfflineModeIsEnabled):
        return errors.HubDownloadsOff(f"model '{repo_id}' cannot be downloaded: HF_HUB_OFFLINE=1 is set in the "
                                      "gateway's environment; unset it (HUB_DOWNLOADS decides about downloads)")
    if isinstance(exc, hf_errors.GatedRepoError):
        return gated(repo_id, options)
    if isinstance(exc, (hf_errors.RepositoryNotFoundError, hf_errors.RevisionNotFoundError)):
        return errors.HubModelNotFound(
            f"model '{repo_id}' does not exist on the hub ({where})"
            + (", or HF_TOKEN has no access to it" if options.token else " (if it is private, set HF_TOKEN)"))
    if isinstance(exc, (requests.ConnectionError, requests.Timeout, hf_errors.LocalEntryNotFoundError)):
        return errors.HubUnreachable(f"the Hugging Face hub ({where}) cannot be reached to get '{repo_id}' "
                                     f"({type(exc).__name__}); check the network or HF_ENDPOINT")
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if isinstance(exc, hf_errors.HfHubHTTPError) and status in (401, 403):
        return gated(repo_id, options)
    if isinstance(exc, hf_errors.HfHubHTTPError):
        return errors.HubUnreachable(f"the Hugging Face hub ({where}) answered HTTP {status} for '{repo_id}'")
    return errors.internal(exc, f"hub metadata of {repo_id}")


def gated(repo_id: str, options: HubOptions) -> errors.HubGated:
    if options.token:
        return errors.HubGated(f"model '{repo_id}' is gated or private and HF_TOKEN has no access to it: accept its "
                               "terms on the hub with the token's account")
    return errors.HubGated(f"model '{repo_id}' is gated on the hub: accept its terms there and set HF_TOKEN "
                           "in the gateway's environment")


def child_error(repo_id: str, result: dict, tail: str, options: HubOptions) -> errors.ApiError:
    """The download child's failure (its exception's class name and HTTP status) as the error that says why."""
    from huggingface_hub import errors as hf_errors
    import requests

    name, status = result.get("error"), result.get("status")
    classes = {c.__name__: c for c in (hf_errors.GatedRepoError, hf_errors.RepositoryNotFoundError,
                                       hf_errors.RevisionNotFoundError, hf_errors.EntryNotFoundError,
                                       hf_errors.LocalEntryNotFoundError, hf_errors.OfflineModeIsEnabled,
                                       requests.ConnectionError, requests.Timeout, requests.ReadTimeout)}
    if name in classes and name != "EntryNotFoundError":
        return explain(classes[name](result.get("message", "")), repo_id, options)
    if status in (401, 403):
        return gated(repo_id, options)
    if isinstance(status, int) and status >= 500:
        return errors.HubUnreachable(f"the Hugging Face hub answered HTTP {status} while downloading '{repo_id}'")
    return errors.internal(RuntimeError(f"hub download of {repo_id} failed: {name}: {result.get('message')} {tail}"),
                           f"hub download of {repo_id}")
