//! The submit form (`/portal/jobs/new`), which posts to the JSON API.

use super::super::*;

#[derive(Template, WebTemplate)]
#[template(path = "submit.html")]
pub(crate) struct SubmitPage {
    page: Page,
    tenants: Vec<String>,
    mig_profiles: Vec<&'static str>,
}

pub(crate) async fn submit_page(
    req: HttpRequest,
    state: web::Data<AppState>,
    who: Option<Principal>,
) -> Result<HttpResponse, ApiError> {
    let Some(who) = who else {
        return Ok(to_sign_in());
    };
    let all = state.store.list_tenants().await?;
    let tenants = visible_tenants(&who, &all, Action::JobSubmit)
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    Ok(render(SubmitPage {
        page: Page::new(&req, &state, &who, "Submit a job", "submit").await,
        tenants,
        // Only what some GPU in MIG mode can make: another profile could never run.
        mig_profiles: allot_scheduler::admission::mig_profiles(&state.store.list_nodes().await?),
    }))
}
